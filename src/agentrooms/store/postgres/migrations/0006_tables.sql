-- Migration 0006: the tables, sequences and indexes of the agentrooms PostgreSQL schema.
--
-- The first migration: it takes the number of the newest one it replaces, as every
-- squash does (sql.py), so a schema built by the migrations before it is already here.
-- The functions are not migrations: every migrate applies functions/*.sql afresh.
--
-- Nothing here names a schema: every object lands in the one the store URL names
-- (?schema=, default "agentrooms") through the search_path.
--
-- Keys and room names use COLLATE "C": byte order of UTF-8, which is Unicode code point
-- order, the order scan() promises. Values and event data are JSON *text* exactly as the
-- client encoded it (not jsonb, which would reorder keys and rewrite numbers).

-- The migrations applied to this schema (migrations/NNNN_name.sql).
CREATE TABLE schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Record versions: one sequence for the whole store, so a version is never reused, not
-- even after a delete and re-create, and no counter row is a lock every write waits on.
CREATE SEQUENCE record_version AS bigint;

-- (room, key) -> value, version, expiry. value is NULL for a row that is no record,
-- absent to every read, scan and compare: a lock placeholder that transact() inserts for
-- an absent key it writes (a put or delete turns it into a record or removes it before
-- commit), or a tombstone, the committed row that locks the absence of a key transacts
-- compare but do not write (see transact()); a tombstone stays until the key is written
-- or its room deleted.
CREATE TABLE records (
    room       text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      text,
    version    bigint NOT NULL,
    expires_at timestamptz,
    PRIMARY KEY (room, key)
) WITH (fillfactor = 85);

-- Expired records, oldest first within a room: what the writes of a room delete a few at a
-- time (see transact(), step 6b), so that a record written with a TTL, a command outcome
-- kept for its retention window or a lock's queue entry left by a dead waiter does not
-- stay in the table for good once it is absent to every read.
CREATE INDEX records_expiry ON records (room, expires_at) WHERE expires_at IS NOT NULL;

-- One row per room that has appended: the last sequence number given (seq) and the first
-- one still readable (low). Only appending transacts, trim_log and delete_room lock it.
CREATE TABLE rooms (
    room text COLLATE "C" PRIMARY KEY,
    seq  bigint NOT NULL DEFAULT 0,
    low  bigint NOT NULL DEFAULT 1
) WITH (fillfactor = 85);

-- Each room's event log, numbered 1, 2, ... without gaps in commit order.
CREATE TABLE events (
    room text COLLATE "C" NOT NULL,
    seq  bigint NOT NULL,
    type text NOT NULL,
    data text NOT NULL,
    time timestamptz NOT NULL,
    PRIMARY KEY (room, seq)
);

-- Set pick numbers: one sequence for the whole store, strictly increasing, so "least
-- recently picked" is exact however close together two picks are.
CREATE SEQUENCE set_pick_order AS bigint;

-- The members of each room's named sets (SetAdd, SetRemove, set_pick, set_size). pick is
-- 0 for a member never picked since it was added, else the set_pick_order number of its
-- latest pick. Every lookup of one member uses the primary key.
CREATE TABLE set_members (
    room   text COLLATE "C" NOT NULL,
    name   text COLLATE "C" NOT NULL,
    member text COLLATE "C" NOT NULL,
    pick   bigint NOT NULL DEFAULT 0 CHECK (pick >= 0),
    PRIMARY KEY (room, name, member)
);

-- set_pick hands out members in (pick, member) order, which this index serves in order,
-- so a pick costs O(log n + count) whatever the set's size. Its predicate is always true
-- but only set_pick's walk states it, so no other statement can use the index: without
-- statistics (a new store) the planner finds it as cheap as the primary key for finding
-- one member, and would then scan the whole set for it.
CREATE INDEX set_members_pick_order ON set_members (room, name, pick, member)
    WHERE pick >= 0;
