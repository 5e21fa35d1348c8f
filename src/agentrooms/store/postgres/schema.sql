-- The agentrooms PostgreSQL schema, current version.
--
-- A fresh store is created by running this file; an existing one is brought here by the
-- numbered files in migrations/ (tests/unit/test_postgres_schema.py checks that both give
-- the same schema). Nothing here names a schema: every object lands in the one the store
-- URL names (?schema=, default "agentrooms") through the search_path, and the functions
-- keep that search_path (SET search_path FROM CURRENT) whoever calls them. They also use
-- generic plans (written to be good for any argument): re-planning their statements on
-- every call would cost more than running them.
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

-- The fencing token of a record's value: the integer "fence" field of a JSON object,
-- else 0. The same rule as agentrooms.store.base.fence_of (a float or a boolean is not a
-- token); numeric, because a JSON integer can be larger than bigint.
CREATE FUNCTION fence_of(value text) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CASE
               WHEN json_typeof(j) = 'object'
                AND json_typeof(j -> 'fence') = 'number'
                AND (j ->> 'fence') ~ '^-?[0-9]+$'
               THEN (j ->> 'fence')::numeric
               ELSE 0
           END
      FROM (SELECT value::json AS j) AS parsed
$$;

-- The key of a room's advisory lock (transaction-scoped): every transact() holds it
-- shared, delete_room() exclusively, so a room is deleted between transacts, never in
-- the middle of one. The schema is part of the key: stores in other schemas of the same
-- database do not wait for each other.
--
-- This and the next two take the schema from current_schema(), their caller's: every
-- caller is a function of this schema (which runs with SET search_path FROM CURRENT)
-- or a session of this store (its search_path is the schema). They have no SET clause
-- of their own so that the planner inlines them: a SQL function with one is called
-- through the function manager, setting and restoring search_path each time, which
-- cost transact() about 0.2 ms per call of each.
CREATE FUNCTION room_lock(p_room text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT hashtextextended('agentrooms.room:' || current_schema() || ':' || p_room, 0)
$$;

-- The key of a room's append lock (transaction-scoped, exclusive): transact() takes it
-- just before the room's row when it appends, so appenders queue in the lock manager,
-- one woken per commit, rather than all racing for the row at each commit.
CREATE FUNCTION append_lock(p_room text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT hashtextextended('agentrooms.append:' || current_schema() || ':' || p_room, 0)
$$;

-- The LISTEN/NOTIFY channel of this schema's store: transact() notifies it with
-- "room:seq" (the room and its newest sequence number) when it appends; watch() listens.
-- A channel name is at most 63 bytes: schemas whose names share their first 52 bytes
-- share a channel, which costs their watchers only a spurious wake-up.
CREATE FUNCTION notify_channel() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT left('agentrooms.' || current_schema(), 63)
$$;

-- transact: the store's one atomic primitive, in one round trip and one transaction
-- (READ COMMITTED is enough: every row it decides on is locked first). One call applies
-- a batch of independent transacts of one room (items 1..n; a lone transact is a batch
-- of one) as if one after the other, in order: each item is all or nothing on its own,
-- sees what the items before it wrote, and fails alone. They share one commit, and the
-- room's append lock is taken once for all of them: a client that has several
-- appending transacts of a room waiting sends them together (backend.py), so appenders
-- queue in the lock manager, and flush the write-ahead log, once per batch rather than
-- once per transact.
--
-- Takes: the room; the items' compares, puts, deletes, set operations and appends, each
-- kind as parallel arrays holding item 1's, then item 2's, ..., and a bounds array of
-- n + 1 offsets (item i's are at offsets bounds[i] + 1 .. bounds[i + 1]). A compare is
-- (key, kind: version|absent|present|fence, arg: the version or fence compared against,
-- NULL otherwise); a put (key, JSON text, ttl in ms or NULL); a delete, its key; a set
-- operation (set, member, net effect within its item: add = insert if absent, keeping a
-- present member's pick order; remove = delete; reset = delete, then insert afresh, for
-- a removal followed by an add), one per distinct (set, member) of the item; an append
-- (type, JSON text).
--
-- Returns one row: now (the store clock, epoch seconds); versions (the new version of
-- each put, in p_put_keys order, NULL for a failed item's); first_seqs (per item: the
-- sequence number of its first appended event, the others following it; NULL if it
-- appended nothing or failed). A failed item changed nothing, and the row says why:
-- stale_at (per item: the 1-based index among its compares of its first stale
-- FenceAtMost, NULL if none) with stale_current (the holder's fence, NULL if the record
-- is absent), else conflict_items/conflict_keys/conflict_versions (flat: every failing
-- key of every item that failed a compare other than a fence, with its current version,
-- NULL if absent; not listed for an item with a stale fence, which takes precedence).
--
-- Locks, always in this order so that transacts never deadlock: the room's advisory lock,
-- shared (room_lock); the record rows of every key the items still in play compare or
-- write, in key order (COLLATE "C"), exclusively for a written key (an absent one gets
-- a placeholder row, so absence is locked too and concurrent creators of a key queue
-- behind each other), shared for a key only compared (an absent one gets a tombstone);
-- the set member rows, in (set, member) order (a delete locks its row; an insert waits
-- only for a concurrent writer of the same member, the uncommitted insert or delete of a
-- transact or a set_pick's update); last, if it appends, the room's append lock
-- (append_lock) and the room's row, after which nothing is waited for. All are held to
-- commit. Items are applied one after the other only once all their rows are locked,
-- and set operations and appends are applied for the whole batch at the end, so a batch
-- takes its locks in this order as a lone transact does. A batch that writes records
-- then deletes up to 32 expired records of the room, locking only rows nobody else holds
-- (SKIP LOCKED) and so never waiting for them. The other writers take locks
-- that fit this order (delete_room: the advisory lock exclusively, first) or never wait
-- while holding one (compare_and_set: one row; set_pick: SKIP LOCKED; trim_log: the
-- room's row, then events only it and appenders holding that row touch), so no cycle of
-- waits can form. Items whose compares already fail in the latest committed state are
-- answered before any lock is taken; if all do, the call takes none.
CREATE FUNCTION transact(
    p_room        text,
    p_cmp_bounds  integer[],
    p_cmp_keys    text[],
    p_cmp_kinds   text[],
    p_cmp_args    numeric[],
    p_put_bounds  integer[],
    p_put_keys    text[],
    p_put_values  text[],
    p_put_ttls    bigint[],
    p_del_bounds  integer[],
    p_del_keys    text[],
    p_set_bounds  integer[],
    p_set_names   text[],
    p_set_members text[],
    p_set_kinds   text[],
    p_app_bounds  integer[],
    p_types       text[],
    p_datas       text[],
    OUT now               double precision,
    OUT versions          bigint[],
    OUT first_seqs        bigint[],
    OUT stale_at          bigint[],
    OUT stale_current     numeric[],
    OUT conflict_items    integer[],
    OUT conflict_keys     text[],
    OUT conflict_versions bigint[]
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_items        integer := cardinality(p_cmp_bounds) - 1;
    v_now          timestamptz := clock_timestamp();
    v_live         boolean[] := array_fill(true, ARRAY[v_items]);
    v_live_count   integer := v_items;
    v_locked       boolean := false;
    v_placeholders bigint := 0;
    v_count        bigint;
    v_version      bigint;
    v_stale_at     bigint;
    v_stale_cur    numeric;
    v_fail_keys    text[];
    v_fail_vers    bigint[];
    v_written      text[] := '{}';  -- keys the items in play write
    v_compared     text[] := '{}';  -- keys they compare
    v_set_names    text[] := '{}';  -- the set operations of the items applied, in order
    v_set_members  text[] := '{}';
    v_set_kinds    text[] := '{}';
    v_set_items    integer := 0;    -- how many of those items have set operations
    v_types        text[] := '{}';  -- the events of the items applied, in order
    v_datas        text[] := '{}';
    v_offsets      bigint[] := array_fill(NULL::bigint, ARRAY[v_items]);
    v_first        bigint;
    v_key          record;
    lo             integer;
    hi             integer;
BEGIN
    versions := array_fill(NULL::bigint, ARRAY[cardinality(p_put_keys)]);
    first_seqs := array_fill(NULL::bigint, ARRAY[v_items]);
    stale_at := array_fill(NULL::bigint, ARRAY[v_items]);
    stale_current := array_fill(NULL::numeric, ARRAY[v_items]);
    -- The compares run twice: first optimistically, against the latest committed state
    -- and without any lock, then (for the items that passed) again once every row they
    -- decide on is locked, each item seeing what the items before it wrote. An item
    -- whose compares fail the first time is answered at once, writing nothing and
    -- waiting for nobody: a losing writer neither queues behind the winner's lock nor
    -- locks (and WAL-logs, and flushes at commit) rows of its own.
    --
    -- Why reporting that failure is linearizable: the first check reads one statement
    -- snapshot, the database as it was at one instant between this call's start and its
    -- return, with every commit acknowledged before the call began; the compares failed
    -- at that instant, and a failed transact changes nothing, so it takes effect there.
    -- It does not matter that the failure may not last (Absent and Present can flip back,
    -- as can an expiry-based absence or a fence; only VersionIs cannot, versions never
    -- being reused): a failure is reported with the versions that made it fail, as of
    -- that instant, as a locked check would report them as of its own.
    LOOP
        FOR i IN 1 .. v_items LOOP
            CONTINUE WHEN NOT v_live[i];
            lo := p_cmp_bounds[i] + 1;
            hi := p_cmp_bounds[i + 1];
            -- Compares, against live rows (a placeholder or an expired record is absent);
            -- in the first round not those of an item that compares a key an item
            -- before it writes: what it compares against does not exist yet.
            IF lo <= hi AND (v_locked OR NOT p_cmp_keys[lo:hi] && v_written) THEN
                SELECT (array_agg(c.i ORDER BY c.i) FILTER (WHERE c.stale))[1],
                       (array_agg(c.fence ORDER BY c.i) FILTER (WHERE c.stale))[1],
                       array_agg(c.key) FILTER (WHERE c.failed),
                       array_agg(c.version) FILTER (WHERE c.failed)
                  INTO v_stale_at, v_stale_cur, v_fail_keys, v_fail_vers
                  FROM (
                      SELECT c.i, c.key, cur.version, cur.fence,
                             c.kind = 'fence'
                                 AND (cur.version IS NULL OR cur.fence > c.arg) AS stale,
                             CASE c.kind
                                 WHEN 'version' THEN cur.version IS DISTINCT FROM c.arg
                                 WHEN 'absent' THEN cur.version IS NOT NULL
                                 WHEN 'present' THEN cur.version IS NULL
                                 ELSE false
                             END AS failed
                        FROM unnest(p_cmp_keys[lo:hi], p_cmp_kinds[lo:hi], p_cmp_args[lo:hi])
                             WITH ORDINALITY AS c (key, kind, arg, i)
                        LEFT JOIN LATERAL (
                            SELECT r.version,
                                   CASE WHEN c.kind = 'fence' THEN fence_of(r.value) END
                                       AS fence
                              FROM records AS r
                             WHERE r.room = p_room AND r.key = c.key
                               AND r.value IS NOT NULL
                               AND (r.expires_at IS NULL OR r.expires_at > v_now)
                        ) AS cur ON true
                  ) AS c;
                IF v_stale_at IS NOT NULL OR v_fail_keys IS NOT NULL THEN
                    v_live[i] := false;
                    v_live_count := v_live_count - 1;
                    IF v_stale_at IS NOT NULL THEN  -- a stale fence takes precedence
                        stale_at[i] := v_stale_at;
                        stale_current[i] := v_stale_cur;
                    ELSE
                        conflict_items := conflict_items
                            || array_fill(i, ARRAY[cardinality(v_fail_keys)]);
                        conflict_keys := conflict_keys || v_fail_keys;
                        conflict_versions := conflict_versions || v_fail_vers;
                    END IF;
                    CONTINUE;
                END IF;
            END IF;
            IF NOT v_locked THEN  -- first round: note what the item locks
                v_written := v_written || p_put_keys[p_put_bounds[i] + 1 : p_put_bounds[i + 1]]
                                       || p_del_keys[p_del_bounds[i] + 1 : p_del_bounds[i + 1]];
                v_compared := v_compared || p_cmp_keys[lo:hi];
                CONTINUE;
            END IF;

            -- 4. The item's puts, one primary-key update each: every row exists (record
            --    or placeholder) and is ours, unless an item before it deleted the key.
            FOR j IN p_put_bounds[i] + 1 .. p_put_bounds[i + 1] LOOP
                UPDATE records
                   SET value = p_put_values[j],
                       version = nextval('record_version'),
                       expires_at = v_now + p_put_ttls[j] * interval '1 millisecond'
                 WHERE room = p_room AND key = p_put_keys[j]
                RETURNING version INTO v_version;
                IF NOT FOUND THEN
                    INSERT INTO records (room, key, value, version, expires_at)
                    VALUES (p_room, p_put_keys[j], p_put_values[j], nextval('record_version'),
                            v_now + p_put_ttls[j] * interval '1 millisecond')
                    RETURNING version INTO v_version;
                END IF;
                versions[j] := v_version;
            END LOOP;

            -- 5. Its deletes.
            IF p_del_bounds[i] < p_del_bounds[i + 1] THEN
                DELETE FROM records
                 WHERE room = p_room
                   AND key = ANY (p_del_keys[p_del_bounds[i] + 1 : p_del_bounds[i + 1]]);
            END IF;

            -- Its set operations and appends, applied for the whole batch below.
            lo := p_set_bounds[i] + 1;
            hi := p_set_bounds[i + 1];
            v_set_names := v_set_names || p_set_names[lo:hi];
            v_set_members := v_set_members || p_set_members[lo:hi];
            v_set_kinds := v_set_kinds || p_set_kinds[lo:hi];
            IF lo <= hi THEN
                v_set_items := v_set_items + 1;
            END IF;
            IF p_app_bounds[i] < p_app_bounds[i + 1] THEN
                v_offsets[i] := cardinality(v_types);
                v_types := v_types || p_types[p_app_bounds[i] + 1 : p_app_bounds[i + 1]];
                v_datas := v_datas || p_datas[p_app_bounds[i] + 1 : p_app_bounds[i + 1]];
            END IF;
        END LOOP;
        EXIT WHEN v_locked OR v_live_count = 0;

        -- 0. The room's advisory lock, shared: transacts never wait for each other on
        --    it, only for a delete_room() of the room (which waits for them).
        PERFORM pg_advisory_xact_lock_shared(room_lock(p_room));

        -- 1. Lock every key of the items in play, in key order. A written key's row is
        --    locked exclusively (WHERE false: locked, not rewritten); an absent one gets
        --    a placeholder that a concurrent creator waits behind. A key only compared
        --    is locked shared (FOR SHARE), so transacts that only compare it (a room's
        --    _meta and _archived, compared by every write in the room) never wait for
        --    each other, while its writers wait for them; its absence is locked by a
        --    tombstone (a committed row with a NULL value, absent to every read and
        --    compare) that it inserts once and later ones lock shared in turn.
        IF cardinality(v_compared) = 0 OR v_compared <@ v_written THEN
            INSERT INTO records AS r (room, key, value, version)
            SELECT p_room, k.key, NULL, 0
              FROM (SELECT DISTINCT unnest(v_written)) AS k (key)
             ORDER BY k.key COLLATE "C"
                ON CONFLICT (room, key) DO UPDATE SET version = r.version WHERE false;
            GET DIAGNOSTICS v_placeholders = ROW_COUNT;
        ELSE
            FOR v_key IN
                SELECT k.key, bool_or(k.written) AS written
                  FROM (SELECT unnest(v_written), true
                        UNION ALL
                        SELECT unnest(v_compared), false) AS k (key, written)
                 GROUP BY k.key
                 ORDER BY k.key COLLATE "C"
            LOOP
                IF v_key.written THEN
                    INSERT INTO records AS r (room, key, value, version)
                    VALUES (p_room, v_key.key, NULL, 0)
                        ON CONFLICT (room, key) DO UPDATE SET version = r.version WHERE false;
                    GET DIAGNOSTICS v_count = ROW_COUNT;
                    v_placeholders := v_placeholders + v_count;
                    CONTINUE;
                END IF;
                LOOP  -- until a committed row is locked shared, or our tombstone inserted
                    PERFORM FROM records AS r
                      WHERE r.room = p_room AND r.key = v_key.key
                        FOR SHARE;
                    EXIT WHEN FOUND;
                    INSERT INTO records (room, key, value, version)
                    VALUES (p_room, v_key.key, NULL, 0)
                        ON CONFLICT (room, key) DO NOTHING;
                    EXIT WHEN FOUND;
                END LOOP;
            END LOOP;
        END IF;

        -- 2. The room's row, which orders appends, is locked last (step 7), so that it
        --    is held for as short a time as possible: from there to commit.

        -- 3. The store clock, read again once everything is locked: expiry, TTLs, event
        --    times; then the compares again (the loop's second round), and the items
        --    that pass them applied (steps 4 and 5 above).
        v_now := clock_timestamp();
        v_locked := true;
    END LOOP;
    now := extract(epoch FROM v_now);
    IF NOT v_locked THEN  -- every item failed its first compares
        RETURN;
    END IF;

    -- Placeholders of items that failed once locked: a lock placeholder never commits
    -- (every other written key is now a record, or deleted). A tombstone, a committed
    -- row, may go too: it is absent either way.
    IF v_placeholders > 0 AND v_live_count < v_items THEN
        DELETE FROM records
         WHERE room = p_room AND key = ANY (v_written) AND value IS NULL;
    END IF;

    -- 6. Set operations, one member at a time in (set, member) order. One item's come
    --    in that order, each member once with its net effect; those of several items are
    --    merged into that form first, each member's net effect over the items in turn
    --    being remove if the last one removes it, add if all only add it, else reset.
    IF v_set_items > 1 THEN
        SELECT array_agg(g.name ORDER BY g.name COLLATE "C", g.member COLLATE "C"),
               array_agg(g.member ORDER BY g.name COLLATE "C", g.member COLLATE "C"),
               array_agg(g.kind ORDER BY g.name COLLATE "C", g.member COLLATE "C")
          INTO v_set_names, v_set_members, v_set_kinds
          FROM (
              SELECT s.name, s.member,
                     CASE
                         WHEN (array_agg(s.kind ORDER BY s.i DESC))[1] = 'remove'
                         THEN 'remove'
                         WHEN bool_and(s.kind = 'add') THEN 'add'
                         ELSE 'reset'
                     END AS kind
                FROM unnest(v_set_names, v_set_members, v_set_kinds)
                     WITH ORDINALITY AS s (name, member, kind, i)
               GROUP BY s.name, s.member
          ) AS g;
    END IF;
    FOR i IN 1 .. cardinality(v_set_names) LOOP
        IF v_set_kinds[i] <> 'add' THEN
            DELETE FROM set_members
             WHERE room = p_room AND name = v_set_names[i] AND member = v_set_members[i];
        END IF;
        IF v_set_kinds[i] <> 'remove' THEN
            INSERT INTO set_members (room, name, member)
            VALUES (p_room, v_set_names[i], v_set_members[i])
                ON CONFLICT (room, name, member) DO NOTHING;
        END IF;
    END LOOP;

    -- 6b. Expired records of the room, a few per writing batch (as on SQLite): the
    --     oldest 32 that nobody holds a lock on. Never waits (SKIP LOCKED), so it adds
    --     no edge to the lock order above; a row it skips is deleted by a later write.
    --     Rows of this batch's own keys are never among them: what it puts expires
    --     after v_now, and what it only compares is absent either way once expired.
    --     One primary-key delete per row found (a statement keyed by a list of row ids
    --     or keys would be planned generically, as every statement here is, and could
    --     scan the table); when nothing has expired, this is one probe of the index.
    IF cardinality(v_written) > 0 THEN
        FOR v_key IN
            SELECT r.key
              FROM records AS r
             WHERE r.room = p_room AND r.expires_at <= v_now
             ORDER BY r.expires_at
             LIMIT 32
               FOR UPDATE SKIP LOCKED
        LOOP
            DELETE FROM records WHERE room = p_room AND key = v_key.key;
        END LOOP;
    END IF;

    -- 7. Appends: lock the room's row (creating it on the first append) and take the
    --    next numbers of its sequence. The lock is held to commit, so that sequence
    --    numbers are gapless and become visible in order; nothing is waited for after
    --    it. Watchers are told the newest (NOTIFY is delivered at commit, and not at
    --    all on a rollback).
    --    Appenders first queue for the room's append lock (advisory, exclusive, to
    --    commit): the lock manager grants it to one waiter at a time, in order, and
    --    the previous holder has committed by then, so the row is never waited for.
    --    Waiting for the row itself would wake every waiter at each commit to race
    --    for it again (an update's wait for a newer row version, or an INSERT's unique
    --    check, waits for the holder's transaction, not in a queue).
    IF cardinality(v_types) > 0 THEN
        PERFORM pg_advisory_xact_lock(append_lock(p_room));
        UPDATE rooms SET seq = seq + cardinality(v_types)
         WHERE room = p_room
        RETURNING seq - cardinality(v_types) + 1 INTO v_first;
        IF NOT FOUND THEN  -- the room's first append
            INSERT INTO rooms AS r (room, seq) VALUES (p_room, cardinality(v_types))
                ON CONFLICT (room) DO UPDATE SET seq = r.seq + cardinality(v_types)
            RETURNING seq - cardinality(v_types) + 1 INTO v_first;
        END IF;
        INSERT INTO events (room, seq, type, data, time)
        SELECT p_room, v_first + e.i - 1, e.type, e.data, v_now
          FROM unnest(v_types, v_datas) WITH ORDINALITY AS e (type, data, i);
        FOR i IN 1 .. v_items LOOP
            first_seqs[i] := v_first + v_offsets[i];
        END LOOP;
        PERFORM pg_notify(notify_channel(), p_room || ':' || (v_first + cardinality(v_types) - 1));
    END IF;
END
$$;

-- transact_recording: transact() for a batch some of whose items record their outcome (a
-- PutOutcome): p_outcome_keys holds, per item, the key of its outcome record, or NULL.
-- Once transact() has applied the batch, each applied item's outcome record gets the field
-- "outcome" added to its JSON object, in the same transaction: {"versions": {key: version}
-- of the item's other puts, "seqs": [...] of its appends}, as the caller is told them.
-- Its own version stays the one transact() gave it.
CREATE FUNCTION transact_recording(
    p_room         text,
    p_cmp_bounds   integer[],
    p_cmp_keys     text[],
    p_cmp_kinds    text[],
    p_cmp_args     numeric[],
    p_put_bounds   integer[],
    p_put_keys     text[],
    p_put_values   text[],
    p_put_ttls     bigint[],
    p_del_bounds   integer[],
    p_del_keys     text[],
    p_set_bounds   integer[],
    p_set_names    text[],
    p_set_members  text[],
    p_set_kinds    text[],
    p_app_bounds   integer[],
    p_types        text[],
    p_datas        text[],
    p_outcome_keys text[],
    OUT now               double precision,
    OUT versions          bigint[],
    OUT first_seqs        bigint[],
    OUT stale_at          bigint[],
    OUT stale_current     numeric[],
    OUT conflict_items    integer[],
    OUT conflict_keys     text[],
    OUT conflict_versions bigint[]
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_done text;
BEGIN
    SELECT t.now, t.versions, t.first_seqs, t.stale_at, t.stale_current,
           t.conflict_items, t.conflict_keys, t.conflict_versions
      INTO now, versions, first_seqs, stale_at, stale_current,
           conflict_items, conflict_keys, conflict_versions
      FROM transact(p_room, p_cmp_bounds, p_cmp_keys, p_cmp_kinds, p_cmp_args,
                    p_put_bounds, p_put_keys, p_put_values, p_put_ttls,
                    p_del_bounds, p_del_keys, p_set_bounds, p_set_names, p_set_members,
                    p_set_kinds, p_app_bounds, p_types, p_datas) AS t;
    FOR i IN 1 .. cardinality(p_outcome_keys) LOOP
        CONTINUE WHEN p_outcome_keys[i] IS NULL OR stale_at[i] IS NOT NULL
                   OR i = ANY (coalesce(conflict_items, '{}'));
        SELECT json_build_object(
                   'versions', coalesce(
                       (SELECT json_object_agg(p_put_keys[j], versions[j] ORDER BY j)
                          FROM generate_series(p_put_bounds[i] + 1, p_put_bounds[i + 1]) AS j
                         WHERE p_put_keys[j] <> p_outcome_keys[i]),
                       '{}'::json),
                   'seqs', coalesce(
                       (SELECT json_agg(first_seqs[i] + k ORDER BY k)
                          FROM generate_series(0, p_app_bounds[i + 1] - p_app_bounds[i] - 1)
                               AS k),
                       '[]'::json))::text
          INTO v_done;
        UPDATE records
           SET value = '{"outcome":' || v_done
                       || CASE WHEN value = '{}' THEN '}' ELSE ',' || substr(value, 2) END
         WHERE room = p_room AND key = p_outcome_keys[i];
    END LOOP;
END
$$;

-- trim_log: drop the room's events before p_before (capped at the newest event + 1) and
-- return the first sequence number still readable, which never decreases. Locks the
-- room's row, so it waits for appends in flight and the delete sees every one of them.
CREATE FUNCTION trim_log(p_room text, p_before bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_low bigint;
BEGIN
    UPDATE rooms SET low = greatest(low, least(p_before, seq + 1))
     WHERE room = p_room
    RETURNING low INTO v_low;
    IF NOT FOUND THEN
        RETURN 1;  -- nothing was ever appended
    END IF;
    DELETE FROM events WHERE room = p_room AND seq < v_low;
    RETURN v_low;
END
$$;

-- set_pick: up to p_count members of the room's set, least recently picked first (never
-- picked, pick 0, first, in member order), each marked picked with the next
-- set_pick_order number in that order; returned with those numbers.
--
-- Concurrent pickers get different members, and a picker never waits: it walks the set
-- in pick order (the set_members_pick_order index, as of the walk's snapshot) and takes
-- each member with FOR UPDATE SKIP LOCKED only if its pick number is still the one the
-- walk saw, so it skips a member another picker holds (locked) and one another picker
-- took after the walk began (pick number changed; on a row updated between this
-- statement's snapshot and its lock, the lock re-checks the condition on the newest
-- version). A plain ORDER BY ... LIMIT ... FOR UPDATE SKIP LOCKED would hand out that
-- second kind twice. Cost: O(log n + rows walked), rows walked = p_count + skipped ones.
CREATE FUNCTION set_pick(
    p_room text, p_name text, p_count integer, OUT member text, OUT pick bigint
) RETURNS SETOF record
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_seen  record;
    v_taken integer := 0;
BEGIN
    IF p_count < 1 THEN
        RETURN;
    END IF;
    FOR v_seen IN
        SELECT s.member, s.pick
          FROM set_members AS s
         WHERE s.room = p_room AND s.name = p_name AND s.pick >= 0  -- the index's predicate
         ORDER BY s.pick, s.member
    LOOP
        PERFORM
           FROM set_members AS m
          WHERE m.room = p_room AND m.name = p_name AND m.member = v_seen.member
            AND m.pick = v_seen.pick
            FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        UPDATE set_members AS m
           SET pick = nextval('set_pick_order')
         WHERE m.room = p_room AND m.name = p_name AND m.member = v_seen.member
        RETURNING m.member, m.pick INTO member, pick;
        RETURN NEXT;
        v_taken := v_taken + 1;
        EXIT WHEN v_taken >= p_count;
    END LOOP;
END
$$;

-- delete_room: delete every record, set member and event of the room in one transaction,
-- keeping its counters: versions come from a store-wide sequence, and the log's sequence
-- continues, with everything up to it trimmed (low = seq + 1), so an old cursor gets
-- CursorCompacted. Holds the room's advisory lock exclusively, so no transact is half
-- done in the room meanwhile (one could otherwise create a key this delete cannot see
-- yet while the delete waits for another key it locked); compare_and_set, set_pick and
-- trim_log need not take it: they neither create keys nor wait while holding a lock.
CREATE FUNCTION delete_room(p_room text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(room_lock(p_room));
    DELETE FROM records WHERE room = p_room;
    DELETE FROM set_members WHERE room = p_room;
    UPDATE rooms SET low = seq + 1 WHERE room = p_room;
    DELETE FROM events WHERE room = p_room;
END
$$;
