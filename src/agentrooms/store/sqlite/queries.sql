-- Every SQL statement the SQLite backend runs, by name (loaded once by sql.py).
--
-- Each query: a "-- name: <name>" header, a one-line description, then one statement.
-- The name starts with the store primitive that runs it (transact_, read_, scan_,
-- read_log_, trim_log_, last_seq, set_pick_, set_size, glance_, watch_, delete_room_), so
-- one grep finds every layer of a primitive.
-- Parameters are named. :now_ms is the store clock in milliseconds, read once per
-- operation inside its transaction; a row is live when expires_ms IS NULL OR
-- expires_ms > :now_ms, and an expired row is absent to every query below.

-- name: read_one
-- The live record (room, key): key, value, version, expires_ms.
SELECT key, value, version, expires_ms
FROM records
WHERE room = :room AND key = :key AND (expires_ms IS NULL OR expires_ms > :now_ms);

-- name: read_many
-- The live records of a room whose keys are in :keys (a JSON array of strings).
SELECT key, value, version, expires_ms
FROM records
WHERE room = :room
  AND key IN (SELECT value FROM json_each(:keys))
  AND (expires_ms IS NULL OR expires_ms > :now_ms);

-- name: transact_compare_one
-- Key, version and (only when :with_value) value of one live record, for the compares.
SELECT key, version, CASE WHEN :with_value THEN value END
FROM records
WHERE room = :room AND key = :key AND (expires_ms IS NULL OR expires_ms > :now_ms);

-- name: transact_compare_many
-- Key, version and (only when :with_value) value of the live records in :keys (JSON array).
SELECT key, version, CASE WHEN :with_value THEN value END
FROM records
WHERE room = :room
  AND key IN (SELECT value FROM json_each(:keys))
  AND (expires_ms IS NULL OR expires_ms > :now_ms);

-- name: transact_revision_read
-- The last store-wide version handed out (read once per write transaction that puts).
SELECT last FROM revision WHERE id = 1;

-- name: transact_revision_write
-- Store the last version handed out, before the write transaction commits.
UPDATE revision SET last = :last WHERE id = 1;

-- name: transact_put
-- Write one record (value, version, expiry), replacing any previous row, expired or not.
INSERT INTO records (room, key, value, version, expires_ms)
VALUES (:room, :key, :value, :version, :expires_ms)
ON CONFLICT (room, key) DO UPDATE SET
    value = excluded.value, version = excluded.version, expires_ms = excluded.expires_ms;

-- name: transact_delete
-- Remove one record (absent is fine).
DELETE FROM records WHERE room = :room AND key = :key;

-- name: transact_next_seqs
-- Reserve :count sequence numbers of a room's log; returns the last (first = last - count + 1).
INSERT INTO rooms (room, seq) VALUES (:room, :count)
ON CONFLICT (room) DO UPDATE SET seq = seq + excluded.seq
RETURNING seq;

-- name: transact_append
-- Store one event at the sequence number reserved for it.
INSERT INTO events (room, seq, type, data, time_ms, author, recipients)
VALUES (:room, :seq, :type, :data, :time_ms, :author, :recipients);

-- name: transact_purge_expired
-- Delete up to :limit rows of the room that expired by :now_ms (absent to every query
-- already; found through the partial index records_expiry, without scanning the room).
DELETE FROM records
WHERE rowid IN (
    SELECT rowid FROM records
    WHERE room = :room AND expires_ms <= :now_ms
    LIMIT :limit
);

-- name: transact_set_add
-- Add a member to a room's set, never picked; a member already there keeps its place.
INSERT INTO set_members (room, name, member, picked_at)
VALUES (:room, :name, :member, NULL)
ON CONFLICT (room, name, member) DO NOTHING;

-- name: transact_set_remove
-- Remove a member from a room's set (absent is fine).
DELETE FROM set_members WHERE room = :room AND name = :name AND member = :member;

-- name: scan_records
-- Up to :limit live records with :low <= key < :high (an empty BLOB :high sorts after every
-- TEXT key: no upper bound), key <> :skip (NULL: none), in key order.
SELECT key, value, version, expires_ms
FROM records
WHERE room = :room
  AND key >= :low AND key < :high AND key IS NOT :skip
  AND (expires_ms IS NULL OR expires_ms > :now_ms)
ORDER BY key
LIMIT :limit;

-- name: scan_keys
-- As scan_records, the keys only.
SELECT key
FROM records
WHERE room = :room
  AND key >= :low AND key < :high AND key IS NOT :skip
  AND (expires_ms IS NULL OR expires_ms > :now_ms)
ORDER BY key
LIMIT :limit;

-- name: read_log_low
-- The first sequence number of a room's log that has not been trimmed (no row: 1).
SELECT low FROM rooms WHERE room = :room;

-- name: read_log_events
-- Up to :limit events of a room with seq > :after, in order.
SELECT seq, type, data, time_ms, author, recipients
FROM events
WHERE room = :room AND seq > :after
ORDER BY seq
LIMIT :limit;

-- name: trim_log_state
-- The room's last sequence number and first untrimmed one.
SELECT seq, low FROM rooms WHERE room = :room;

-- name: trim_log_events
-- Drop a room's events below :low.
DELETE FROM events WHERE room = :room AND seq < :low;

-- name: trim_log_low
-- Record the room's new first untrimmed sequence number.
UPDATE rooms SET low = :low WHERE room = :room;

-- name: last_seq
-- The sequence number of the room's newest event (no row: 0).
SELECT seq FROM rooms WHERE room = :room;

-- name: set_pick_members
-- The first :limit members of a set in pick order: never picked (picked_at NULL) first in
-- member order, then least recently picked (read from the start of set_members_pick).
SELECT member
FROM set_members
WHERE room = :room AND name = :name
ORDER BY picked_at, member
LIMIT :limit;

-- name: set_pick_last
-- The set's pick counter: the largest picked_at among its members (no row or NULL: none).
SELECT picked_at
FROM set_members
WHERE room = :room AND name = :name
ORDER BY picked_at DESC
LIMIT 1;

-- name: set_pick_mark
-- Mark one member picked at :picked_at (a value of the set's pick counter).
UPDATE set_members SET picked_at = :picked_at
WHERE room = :room AND name = :name AND member = :member;

-- name: set_size
-- How many members a room's set has.
SELECT count(*) FROM set_members WHERE room = :room AND name = :name;

-- name: glance_records
-- The live records of the rooms :rooms whose keys are in :keys (both JSON arrays): room,
-- key, value, version, expires_ms; one primary-key lookup per room and key.
SELECT r.room, r.key, r.value, r.version, r.expires_ms
FROM json_each(:rooms) AS g
CROSS JOIN json_each(:keys) AS k
CROSS JOIN records AS r ON r.room = g.value AND r.key = k.value
WHERE r.expires_ms IS NULL OR r.expires_ms > :now_ms;

-- name: glance_seqs
-- The last sequence number of each room in :rooms (a JSON array) that has a log.
SELECT room, seq FROM rooms WHERE room IN (SELECT value FROM json_each(:rooms));

-- name: glance_set_sizes
-- How many members each set of :names has in each room of :rooms (JSON arrays).
SELECT g.value, n.value,
       (SELECT count(*) FROM set_members AS m WHERE m.room = g.value AND m.name = n.value)
FROM json_each(:rooms) AS g
CROSS JOIN json_each(:names) AS n;

-- name: watch_data_version
-- Changes when another connection (another process) has committed since the last reading.
PRAGMA data_version;

-- name: watch_seqs
-- The last sequence number of each room in :rooms (a JSON array) that has a log.
SELECT room, seq FROM rooms WHERE room IN (SELECT value FROM json_each(:rooms));

-- name: delete_room_records
-- Delete every record of a room.
DELETE FROM records WHERE room = :room;

-- name: delete_room_sets
-- Delete every member of every set of a room.
DELETE FROM set_members WHERE room = :room;

-- name: delete_room_events
-- Delete every event of a room's log.
DELETE FROM events WHERE room = :room;

-- name: delete_room_low
-- Trim the whole log: the sequence continues, and cursors from before get CursorCompacted.
UPDATE rooms SET low = seq + 1 WHERE room = :room;
