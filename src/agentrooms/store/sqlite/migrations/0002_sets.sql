-- Migration 0002: per-room named sets (SetAdd / SetRemove, set_pick, set_size) and an
-- index on expiring records, so that a write transaction can purge a few expired rows
-- of its room without scanning the room.
--
-- Applied by agentrooms.store.sqlite.sql.migrate inside BEGIN IMMEDIATE, which then sets
-- PRAGMA user_version = 2. Statements only: no BEGIN/COMMIT here.

CREATE TABLE set_members (
    room      TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    member    TEXT    NOT NULL,
    picked_at INTEGER,
    PRIMARY KEY (room, name, member)
) WITHOUT ROWID;

CREATE INDEX set_members_pick ON set_members (room, name, picked_at, member);

CREATE INDEX records_expiry ON records (room, expires_ms) WHERE expires_ms IS NOT NULL;
