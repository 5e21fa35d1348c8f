-- Migration 0002: the agentrooms SQLite schema.
--
-- The first migration: it takes the number of the newest one it replaces, as every
-- squash does (sql.py), so a database built by the migrations before it is already here.
-- Applied by agentrooms.store.sqlite.sql.migrate inside BEGIN IMMEDIATE, which then sets
-- PRAGMA user_version = 2. Statements only: no BEGIN/COMMIT here.
--
-- records   One row per record of a room. value is the JSON text exactly as the client
--           gave it; version comes from revision.last; expires_ms is store-clock
--           milliseconds since the epoch (NULL: never). An expired row stays until it is
--           overwritten, deleted or purged (a write transaction deletes a few expired
--           rows of its room, found through the partial index records_expiry), but every
--           query treats it as absent.
-- events    A room's log. seq is per room, gapless, handed out from rooms.seq.
-- rooms     Per room: seq = the last sequence number given, low = the first one not
--           trimmed (read_log raises CursorCompacted below it). Created on first append
--           or trim; delete_room keeps it (with low = seq + 1) so the sequence continues.
-- set_members
--           One row per member of a room's named set. picked_at orders the picks: NULL
--           for a member never picked (or removed and added again), else the set's pick
--           counter when it was last picked (1 + the largest picked_at among the set's
--           members: strictly increasing within a set and never a clock reading, so two
--           picks in one millisecond keep their order). set_pick reads the index
--           set_members_pick from its start: (picked_at, member) with NULL first is never
--           picked members in member order, then the least recently picked; so its cost
--           does not grow with the size of the set.
-- revision  One row: the store-wide counter versions come from, so a version is never
--           reused, not even after a delete and re-create. (SQLite serialises writers, so
--           this row costs no extra waiting.)
--
-- Keys sort by the default BINARY collation, i.e. UTF-8 bytes, i.e. code point order.

CREATE TABLE records (
    room       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    expires_ms INTEGER,
    PRIMARY KEY (room, key)
);

CREATE TABLE events (
    room    TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    type    TEXT    NOT NULL,
    data    TEXT    NOT NULL,
    time_ms INTEGER NOT NULL,
    PRIMARY KEY (room, seq)
);

CREATE TABLE rooms (
    room TEXT    NOT NULL PRIMARY KEY,
    seq  INTEGER NOT NULL DEFAULT 0,
    low  INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID;

CREATE TABLE revision (
    id   INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);

INSERT INTO revision (id, last) VALUES (1, 0);

CREATE TABLE set_members (
    room      TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    member    TEXT    NOT NULL,
    picked_at INTEGER,
    PRIMARY KEY (room, name, member)
) WITHOUT ROWID;

CREATE INDEX set_members_pick ON set_members (room, name, picked_at, member);

CREATE INDEX records_expiry ON records (room, expires_ms) WHERE expires_ms IS NOT NULL;
