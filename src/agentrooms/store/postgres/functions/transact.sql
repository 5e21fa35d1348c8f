-- transact: the store's one atomic primitive, in one round trip and one transaction
-- (READ COMMITTED is enough: every row it decides on is locked first). One call applies
-- a batch of independent transacts of one room (items 1..n; a lone transact is a batch
-- of one) as if one after the other, in order: each item is all or nothing on its own,
-- sees what the items before it wrote, and fails alone. They share one commit, and the
-- room's append lock is taken once for all of them: a client that has several
-- appending transacts of a room waiting sends them together (batches.py), so appenders
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
-- (type, JSON text). p_outcome_keys (NULL when no item records its outcome) holds, per
-- item, the key of the item's outcome record (a PutOutcome, among its puts) or NULL.
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
CREATE OR REPLACE FUNCTION transact(
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
    p_authors     text[],
    p_recipients  text[],
    p_outcome_keys text[] DEFAULT NULL,
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
    v_authors      text[] := '{}';
    v_recipients   text[] := '{}';
    v_offsets      bigint[] := array_fill(NULL::bigint, ARRAY[v_items]);
    v_first        bigint;
    v_done         text;
    v_key          record;
    lo             integer;
    hi             integer;
BEGIN
    -- Its locking is correct at READ COMMITTED only; a session can reach here at another
    -- level when a connection pooler dropped the store's startup setting, or the server's
    -- or role's default differs: refuse (SQLSTATE AR001, the store's BadRequest).
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'transact() needs READ COMMITTED, the session is at %',
            current_setting('transaction_isolation') USING ERRCODE = 'AR001';
    END IF;
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
            --    Each takes a new block of versions from the sequence
            --    (migrations/0010_version_blocks.sql).
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
                v_authors := v_authors
                    || p_authors[p_app_bounds[i] + 1 : p_app_bounds[i + 1]];
                v_recipients := v_recipients
                    || p_recipients[p_app_bounds[i] + 1 : p_app_bounds[i + 1]];
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
        INSERT INTO events (room, seq, type, data, time, author, recipients)
        SELECT p_room, v_first + e.i - 1, e.type, e.data, v_now, e.author, e.recipients
          FROM unnest(v_types, v_datas, v_authors, v_recipients)
               WITH ORDINALITY AS e (type, data, author, recipients, i);
        FOR i IN 1 .. v_items LOOP
            first_seqs[i] := v_first + v_offsets[i];
        END LOOP;
        PERFORM pg_notify(notify_channel(), p_room || ':' || (v_first + cardinality(v_types) - 1));
    END IF;

    -- 8. Recorded outcomes: each applied item's outcome record gets the field "outcome"
    --    added to its JSON object: {"versions": {key: version} of the item's other puts,
    --    "seqs": [...] of its appends}, as the caller is told them. The record keeps the
    --    version step 4 gave it, and its row is already locked.
    FOR i IN 1 .. coalesce(cardinality(p_outcome_keys), 0) LOOP
        CONTINUE WHEN p_outcome_keys[i] IS NULL OR NOT v_live[i];
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
