-- 0003: contention. transact() re-created (same signature): its compares are checked
-- first without locks (a transact that already fails returns at once); keys only
-- compared are locked shared, their absence by a committed tombstone row (value NULL);
-- the room's row is locked last, behind the new per-room append lock (append_lock), so
-- appenders queue rather than race. The read, scan and compare_and_set queries skip
-- rows with a NULL value (queries.sql).

-- The key of a room's append lock (transaction-scoped, exclusive): transact() takes it
-- just before the room's row when it appends, so appenders queue in the lock manager,
-- one woken per commit, rather than all racing for the row at each commit.
CREATE FUNCTION append_lock(p_room text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
    SELECT hashtextextended('agentrooms.append:' || current_schema() || ':' || p_room, 0)
$$;

-- transact: the store's one atomic primitive, in one round trip and one transaction
-- (READ COMMITTED is enough: every row it decides on is locked first).
--
-- Takes: the room; p_keys, every key compared or written, distinct and sorted in code
-- point order; the compares as parallel arrays (key, kind: version|absent|present|fence,
-- arg: the version or fence compared against, NULL otherwise); the puts (key, JSON text,
-- ttl in ms or NULL); the keys to delete; the set operations, one per distinct (set,
-- member), sorted by set name then member in code point order, each with its net effect
-- (kind: add = insert if absent, keeping a present member's pick order; remove = delete;
-- reset = delete, then insert afresh, for a removal followed by an add); the events to
-- append (type, JSON text).
--
-- Returns one row. On success: now (the store clock, epoch seconds), versions (the new
-- version of each put, in p_put_keys order) and first_seq (the sequence number of the
-- first appended event; the others follow it). On a failed compare nothing is changed
-- and the row says why: stale_at (1-based index of the first stale FenceAtMost) and
-- stale_current (the holder's fence, NULL if the record is absent), else
-- conflict_keys/conflict_versions (every failing key with its current version, NULL if
-- absent).
--
-- Locks, always in this order so that transacts never deadlock: the room's advisory lock,
-- shared (room_lock); the record rows of p_keys in key order, exclusively for a written
-- key (an absent one gets a placeholder row, so absence is locked too and concurrent
-- creators of a key queue behind each other), shared for a key only compared (an absent
-- one gets a tombstone); the set member rows, in (set, member) order (a delete locks its
-- row; an insert waits only for a concurrent writer of the same member, the uncommitted
-- insert or delete of a transact or a set_pick's update); last, if it appends, the room's
-- append lock (append_lock) and the room's row, after which nothing is waited for. All
-- are held to commit. The other writers take locks that fit this order (delete_room: the
-- advisory lock exclusively, first) or never wait while holding one (compare_and_set: one
-- row; set_pick: SKIP LOCKED; trim_log: the room's row, then events only it and appenders
-- holding that row touch), so no cycle of waits can form. A transact whose compares
-- already fail in the latest committed state returns before taking any lock.
CREATE OR REPLACE FUNCTION transact(
    p_room        text,
    p_keys        text[],
    p_cmp_keys    text[],
    p_cmp_kinds   text[],
    p_cmp_args    numeric[],
    p_put_keys    text[],
    p_put_values  text[],
    p_put_ttls    bigint[],
    p_del_keys    text[],
    p_set_names   text[],
    p_set_members text[],
    p_set_kinds   text[],
    p_types       text[],
    p_datas       text[],
    OUT now               double precision,
    OUT versions          bigint[],
    OUT first_seq         bigint,
    OUT stale_at          bigint,
    OUT stale_current     numeric,
    OUT conflict_keys     text[],
    OUT conflict_versions bigint[]
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now          timestamptz := clock_timestamp();
    v_placeholders bigint := 0;
    v_version      bigint;
    v_locked       boolean := false;
    v_key          record;
    v_count        bigint;
BEGIN
    -- The compares run twice: first optimistically, against the latest committed state
    -- and without any lock, then (if they all held) again once every row they decide on
    -- is locked. A compare that fails the first time ends the transact at once, writing
    -- nothing and waiting for nobody: a losing writer neither queues behind the winner's
    -- lock nor locks (and WAL-logs, and flushes at commit) rows of its own.
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
        -- Compares, against live rows (a placeholder or an expired record is absent).
        IF cardinality(p_cmp_keys) > 0 THEN
            SELECT (array_agg(c.i ORDER BY c.i) FILTER (WHERE c.stale))[1],
                   (array_agg(c.fence ORDER BY c.i) FILTER (WHERE c.stale))[1],
                   array_agg(c.key) FILTER (WHERE c.failed),
                   array_agg(c.version) FILTER (WHERE c.failed)
              INTO stale_at, stale_current, conflict_keys, conflict_versions
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
                    FROM unnest(p_cmp_keys, p_cmp_kinds, p_cmp_args)
                         WITH ORDINALITY AS c (key, kind, arg, i)
                    LEFT JOIN LATERAL (
                        SELECT r.version,
                               CASE WHEN c.kind = 'fence' THEN fence_of(r.value) END AS fence
                          FROM records AS r
                         WHERE r.room = p_room AND r.key = c.key AND r.value IS NOT NULL
                           AND (r.expires_at IS NULL OR r.expires_at > v_now)
                    ) AS cur ON true
              ) AS c;
            IF stale_at IS NOT NULL OR conflict_keys IS NOT NULL THEN
                IF v_placeholders > 0 THEN  -- a tombstone stays: it may be locked shared
                    DELETE FROM records
                     WHERE room = p_room AND key = ANY (p_put_keys || p_del_keys)
                       AND value IS NULL;
                END IF;
                IF stale_at IS NOT NULL THEN  -- a stale fence takes precedence
                    conflict_keys := NULL;
                    conflict_versions := NULL;
                END IF;
                now := extract(epoch FROM v_now);
                RETURN;
            END IF;
        END IF;
        EXIT WHEN v_locked;

        -- 0. The room's advisory lock, shared: transacts never wait for each other on
        --    it, only for a delete_room() of the room (which waits for them).
        PERFORM pg_advisory_xact_lock_shared(room_lock(p_room));

        -- 1. Lock every key, in key order. A written key's row is locked exclusively
        --    (WHERE false: locked, not rewritten); an absent one gets a placeholder
        --    that a concurrent creator waits behind. A key only compared is locked
        --    shared (FOR SHARE), so transacts that only compare it (a room's _meta and
        --    _archived, compared by every write in the room) never wait for each
        --    other, while its writers wait for them; its absence is locked by a
        --    tombstone (a committed row with a NULL value, absent to every read and
        --    compare) that it inserts once and later ones lock shared in turn.
        IF cardinality(p_keys) = cardinality(p_put_keys) + cardinality(p_del_keys) THEN
            INSERT INTO records AS r (room, key, value, version)
            SELECT p_room, k.key, NULL, 0
              FROM unnest(p_keys) WITH ORDINALITY AS k (key, i)
             ORDER BY k.i
                ON CONFLICT (room, key) DO UPDATE SET version = r.version WHERE false;
            GET DIAGNOSTICS v_placeholders = ROW_COUNT;
        ELSE
            FOR v_key IN
                SELECT k.key, w.key IS NOT NULL AS written
                  FROM unnest(p_keys) WITH ORDINALITY AS k (key, i)
                  LEFT JOIN (SELECT DISTINCT unnest(p_put_keys || p_del_keys)) AS w (key)
                         ON w.key = k.key
                 ORDER BY k.i
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
        --    times; then the compares again (the loop's second round).
        v_now := clock_timestamp();
        v_locked := true;
    END LOOP;
    now := extract(epoch FROM v_now);

    -- 4. Puts, one primary-key update each: every row exists (record or placeholder)
    --    and is ours.
    FOR i IN 1 .. coalesce(cardinality(p_put_keys), 0) LOOP
        UPDATE records
           SET value = p_put_values[i],
               version = nextval('record_version'),
               expires_at = v_now + p_put_ttls[i] * interval '1 millisecond'
         WHERE room = p_room AND key = p_put_keys[i]
        RETURNING version INTO v_version;
        versions[i] := v_version;
    END LOOP;

    -- 5. Deletes (every placeholder is a put's, and now a record).
    IF cardinality(p_del_keys) > 0 THEN
        DELETE FROM records WHERE room = p_room AND key = ANY (p_del_keys);
    END IF;

    -- 6. Set operations, one member at a time in (set, member) order.
    FOR i IN 1 .. coalesce(cardinality(p_set_names), 0) LOOP
        IF p_set_kinds[i] <> 'add' THEN
            DELETE FROM set_members
             WHERE room = p_room AND name = p_set_names[i] AND member = p_set_members[i];
        END IF;
        IF p_set_kinds[i] <> 'remove' THEN
            INSERT INTO set_members (room, name, member)
            VALUES (p_room, p_set_names[i], p_set_members[i])
                ON CONFLICT (room, name, member) DO NOTHING;
        END IF;
    END LOOP;

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
    IF cardinality(p_types) > 0 THEN
        PERFORM pg_advisory_xact_lock(append_lock(p_room));
        UPDATE rooms SET seq = seq + cardinality(p_types)
         WHERE room = p_room
        RETURNING seq - cardinality(p_types) + 1 INTO first_seq;
        IF NOT FOUND THEN  -- the room's first append
            INSERT INTO rooms AS r (room, seq) VALUES (p_room, cardinality(p_types))
                ON CONFLICT (room) DO UPDATE SET seq = r.seq + cardinality(p_types)
            RETURNING seq - cardinality(p_types) + 1 INTO first_seq;
        END IF;
        INSERT INTO events (room, seq, type, data, time)
        SELECT p_room, first_seq + e.i - 1, e.type, e.data, v_now
          FROM unnest(p_types, p_datas) WITH ORDINALITY AS e (type, data, i);
        PERFORM pg_notify(
            notify_channel(), p_room || ':' || (first_seq + cardinality(p_types) - 1)
        );
    END IF;
END
$$;
