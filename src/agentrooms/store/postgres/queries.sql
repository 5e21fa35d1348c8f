-- The named queries of the PostgreSQL backend, loaded once at start-up (sql.py).
--
-- Each query starts with a "-- name: NAME" line and a one-line description; $1, $2, ...
-- are its arguments (further comments are part of the SQL). Every table, sequence and
-- function is qualified with {schema}, replaced by the store's quoted schema (sql.py's
-- Query.on), so a query never depends on the session's search_path, which a connection
-- pooler may drop. Times go out as float epoch seconds; JSON goes in and out as text.

-- name: namespace_exists
-- Whether schema $1 (a quoted identifier) exists.
SELECT to_regnamespace($1) IS NOT NULL;

-- name: schema_exists
-- Whether the store's schema has a migrations table yet.
SELECT to_regclass('{schema}.schema_migrations') IS NOT NULL;

-- name: schema_version
-- The newest migration applied to the store's schema.
SELECT coalesce(max(version), 0) FROM {schema}.schema_migrations;

-- name: lock_migrations
-- Serialise changes to schema $1 by every opener, in every process, until commit.
SELECT pg_advisory_xact_lock(hashtextextended('agentrooms.migrate:' || $1, 0));

-- name: function_digests
-- The functions of the store's schema, each with its comment (sql.py's DIGESTS).
SELECT p.proname AS name, obj_description(p.oid, 'pg_proc') AS digest
  FROM pg_proc AS p
 WHERE p.pronamespace = to_regnamespace('{schema}');

-- name: record_migration
-- Note migration $1 (named $2) as applied.
INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2);

-- name: read
-- The live records among keys $2 (distinct) of room $1, and the store clock, in one
-- snapshot. One row with a NULL key when none is live.
-- One primary-key lookup per key, whatever the room's size: the LIMIT keeps the lateral
-- subquery from being flattened into a join that the generic plan (made once per
-- connection, blind to how many records the room has) would run as a scan of the
-- room's whole key range ("r.key = ANY ($2)" was planned that way).
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts)
SELECT extract(epoch FROM clock.ts)::float8 AS now,
       r.key, r.value, r.version,
       extract(epoch FROM r.expires_at)::float8 AS expires_at
  FROM clock
  LEFT JOIN (unnest($2::text[]) AS k (key)
             CROSS JOIN LATERAL (
                 SELECT r.key, r.value, r.version, r.expires_at
                   FROM {schema}.records AS r
                  WHERE r.room = $1 AND r.key = k.key AND r.value IS NOT NULL
                  LIMIT 1
             ) AS r)
         ON r.expires_at IS NULL OR r.expires_at > clock.ts;

-- name: glance
-- Rooms $1 (i: the place in $1), in one snapshot, as rows (i, item, value, n, expires_at)
-- of plain columns: per room its newest seq (item 0, n; NULL: none), the size of each set
-- of $3 (item -j for the j-th, n), each live record among keys $2 (distinct; item j for
-- the j-th, its value, version n and expiry), and one row i = 0 with the clock in
-- expires_at. One primary-key lookup per room and key, as in read; no arrays to build or
-- decode.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts),
g AS MATERIALIZED (SELECT g.room, g.i FROM unnest($1::text[]) WITH ORDINALITY AS g (room, i))
SELECT 0::int8 AS i, 0::int8 AS item, NULL::text AS value, NULL::int8 AS n,
       extract(epoch FROM clock.ts)::float8 AS expires_at
  FROM clock
UNION ALL
SELECT g.i, 0, NULL, (SELECT s.seq FROM {schema}.rooms AS s WHERE s.room = g.room), NULL
  FROM g
UNION ALL
SELECT g.i, -n.i, NULL,
       (SELECT count(*) FROM {schema}.set_members AS m WHERE m.room = g.room AND m.name = n.name),
       NULL
  FROM g
 CROSS JOIN unnest($3::text[]) WITH ORDINALITY AS n (name, i)
UNION ALL
SELECT g.i, k.i, r.value, r.version, extract(epoch FROM r.expires_at)::float8
  FROM clock
 CROSS JOIN g
 CROSS JOIN unnest($2::text[]) WITH ORDINALITY AS k (key, i)
 CROSS JOIN LATERAL (
     SELECT r.value, r.version, r.expires_at
       FROM {schema}.records AS r
      WHERE r.room = g.room AND r.key = k.key AND r.value IS NOT NULL
        AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
      LIMIT 1
 ) AS r;

-- name: transact
-- Apply a batch of independent transacts of one room, each all or nothing, in one
-- transaction ($21: per item, the key of its outcome record or NULL; NULL if none
-- records one): see functions/transact.sql.
SELECT now, versions, first_seqs, stale_at, stale_current,
       conflict_items, conflict_keys, conflict_versions
  FROM {schema}.transact($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                         $17, $18, $19, $20, $21);

-- name: compare_and_set
-- The commonest transact, a put guarded by its own version, as one plain statement.
-- Put $3 (ttl $4 ms) at key $2 of room $1 if the record is live at version $5: the new
-- version and the clock, or no row (not applied: read the record to find out why).
-- The new version is the next of the record's block of versions, a new block from the
-- store-wide sequence only once that one is used up (migrations/0010_version_blocks.sql).
UPDATE {schema}.records
   SET value = $3,
       version = CASE WHEN (version + 1) % 1024 = 0 THEN nextval('{schema}.record_version')
                      ELSE version + 1 END,
       expires_at = clock_timestamp() + $4 * interval '1 millisecond'
 WHERE room = $1 AND key = $2 AND version = $5 AND value IS NOT NULL
   AND (expires_at IS NULL OR expires_at > clock_timestamp())
RETURNING version, extract(epoch FROM clock_timestamp())::float8 AS now;

-- name: scan
-- A page of live records of room $1 in key order, and whether more keys follow it.
-- $2 <= key < $3 (a prefix's range), key > $4, at most $5 records; "more": a full page
-- and some key of the range (live or not) after it.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts),
page AS MATERIALIZED (
    SELECT r.key, r.value, r.version, r.expires_at
      FROM {schema}.records AS r, clock
     WHERE r.room = $1 AND r.key >= $2 AND r.key < $3 AND r.key > $4 AND r.value IS NOT NULL
       AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
     ORDER BY r.key
     LIMIT $5
)
SELECT extract(epoch FROM clock.ts)::float8 AS now,
       page.key, page.value, page.version,
       extract(epoch FROM page.expires_at)::float8 AS expires_at,
       (SELECT count(*) FROM page) = $5 AND EXISTS (
           SELECT 1 FROM {schema}.records AS m
            WHERE m.room = $1 AND m.key < $3 AND m.key > (SELECT max(key) FROM page)
       ) AS more
  FROM clock
  LEFT JOIN page ON true
 ORDER BY page.key;

-- name: scan_to_end
-- As scan, for a range with no upper bound (the empty prefix).
-- key >= $2, key > $3, at most $4 records.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts),
page AS MATERIALIZED (
    SELECT r.key, r.value, r.version, r.expires_at
      FROM {schema}.records AS r, clock
     WHERE r.room = $1 AND r.key >= $2 AND r.key > $3 AND r.value IS NOT NULL
       AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
     ORDER BY r.key
     LIMIT $4
)
SELECT extract(epoch FROM clock.ts)::float8 AS now,
       page.key, page.value, page.version,
       extract(epoch FROM page.expires_at)::float8 AS expires_at,
       (SELECT count(*) FROM page) = $4 AND EXISTS (
           SELECT 1 FROM {schema}.records AS m
            WHERE m.room = $1 AND m.key > (SELECT max(key) FROM page)
       ) AS more
  FROM clock
  LEFT JOIN page ON true
 ORDER BY page.key;

-- name: scan_rooms
-- scan for each room of $1 (g.i: its place in $1) in one statement (one snapshot): its
-- first $5 + 1 live records with $2 <= key < $3 and key > $4 (one more than a page, to
-- tell whether more follow), or one row with a NULL key when it has none.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts)
SELECT extract(epoch FROM clock.ts)::float8 AS now, g.i, p.key, p.value, p.version,
       extract(epoch FROM p.expires_at)::float8 AS expires_at
  FROM clock
 CROSS JOIN unnest($1::text[]) WITH ORDINALITY AS g (room, i)
  LEFT JOIN LATERAL (
      SELECT r.key, r.value, r.version, r.expires_at
        FROM {schema}.records AS r
       WHERE r.room = g.room AND r.key >= $2 AND r.key < $3 AND r.key > $4
         AND r.value IS NOT NULL AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
       ORDER BY r.key
       LIMIT $5 + 1
  ) AS p ON true
 ORDER BY g.i, p.key;

-- name: scan_rooms_to_end
-- As scan_rooms, for a range with no upper bound (the empty prefix): key >= $2, key > $3,
-- $4 + 1 records per room.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts)
SELECT extract(epoch FROM clock.ts)::float8 AS now, g.i, p.key, p.value, p.version,
       extract(epoch FROM p.expires_at)::float8 AS expires_at
  FROM clock
 CROSS JOIN unnest($1::text[]) WITH ORDINALITY AS g (room, i)
  LEFT JOIN LATERAL (
      SELECT r.key, r.value, r.version, r.expires_at
        FROM {schema}.records AS r
       WHERE r.room = g.room AND r.key >= $2 AND r.key > $3
         AND r.value IS NOT NULL AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
       ORDER BY r.key
       LIMIT $4 + 1
  ) AS p ON true
 ORDER BY g.i, p.key;

-- name: scan_keys
-- As scan_rooms, the keys only (g.i and the key; no row for a room with none).
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts)
SELECT g.i, p.key
  FROM clock
 CROSS JOIN unnest($1::text[]) WITH ORDINALITY AS g (room, i)
 CROSS JOIN LATERAL (
      SELECT r.key
        FROM {schema}.records AS r
       WHERE r.room = g.room AND r.key >= $2 AND r.key < $3 AND r.key > $4
         AND r.value IS NOT NULL AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
       ORDER BY r.key
       LIMIT $5 + 1
  ) AS p
 ORDER BY g.i, p.key;

-- name: scan_keys_to_end
-- As scan_keys, for a range with no upper bound: key >= $2, key > $3, $4 + 1 per room.
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS ts)
SELECT g.i, p.key
  FROM clock
 CROSS JOIN unnest($1::text[]) WITH ORDINALITY AS g (room, i)
 CROSS JOIN LATERAL (
      SELECT r.key
        FROM {schema}.records AS r
       WHERE r.room = g.room AND r.key >= $2 AND r.key > $3
         AND r.value IS NOT NULL AND (r.expires_at IS NULL OR r.expires_at > clock.ts)
       ORDER BY r.key
       LIMIT $4 + 1
  ) AS p
 ORDER BY g.i, p.key;

-- name: read_log
-- Room $1's first readable seq and up to $3 events after seq $2, in one snapshot.
-- No events when $2 is before the first readable one; one row with a NULL seq if none.
WITH room AS MATERIALIZED (
    SELECT coalesce((SELECT low FROM {schema}.rooms WHERE room = $1), 1) AS low
)
SELECT room.low, e.seq, e.type, e.data, extract(epoch FROM e.time)::float8 AS time, e.author,
       e.recipients
  FROM room
  LEFT JOIN LATERAL (
      SELECT seq, type, data, time, author, recipients
        FROM {schema}.events
       WHERE events.room = $1 AND events.seq > $2 AND $2 + 1 >= room.low
       ORDER BY seq
       LIMIT $3
  ) AS e ON true
 ORDER BY e.seq;

-- name: trim_log
-- Drop room $1's events before seq $2; returns the first readable seq
-- (functions/trim_log.sql).
SELECT {schema}.trim_log($1, $2);

-- name: last_seq
-- The sequence number of room $1's newest event, 0 if it never appended.
SELECT coalesce((SELECT seq FROM {schema}.rooms WHERE room = $1), 0);

-- name: set_pick
-- Up to $3 members of set $2 of room $1, least recently picked first, marked picked: see
-- functions/set_pick.sql. Each comes with its new pick number (their order).
SELECT member, pick FROM {schema}.set_pick($1, $2, $3);

-- name: set_size
-- How many members set $2 of room $1 has.
SELECT count(*) FROM {schema}.set_members WHERE room = $1 AND name = $2;

-- name: delete_room
-- Delete every record, set member and event of room $1, keeping its counters
-- (functions/delete_room.sql).
SELECT {schema}.delete_room($1);

-- name: notify_channel
-- The channel transact() notifies when it appends (LISTENed to by watch), and whether it
-- is this schema's alone: not cut to 63 bytes, so no other schema's channel can equal it.
-- $1 is the schema's name: transact() runs with it as current_schema().
SELECT left('agentrooms.' || $1::text, 63) AS channel,
       octet_length('agentrooms.' || $1::text) < 63 AS exact;

-- name: session_check
-- What the open check compares with the store's expectations: the session's schema (NULL
-- if its search_path names none that exists) and isolation level.
SELECT current_schema() AS schema,
       current_setting('transaction_isolation') AS isolation;

-- name: settings
-- The server settings that decide whether an acknowledged commit survives a crash.
SELECT current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('full_page_writes') AS full_page_writes,
       current_setting('server_version') AS server_version;
