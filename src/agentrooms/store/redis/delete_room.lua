-- delete_room: delete every record, set and event of a room, keeping its counters.
--
--   KEYS[1]   room meta hash (HGET seq; HSET low = seq + 1; ver, seq and pick are kept)
--   KEYS[2]   room scan index (sorted set of record names; read in batches, deleted)
--   KEYS[3]   room event log (stream; deleted)
--   KEYS[4]   room set registry (set of the room's set keys; read, deleted)
-- Also deletes keys discovered through the index (ARGV[1] .. name) and the registry (the
-- set keys): they are in the same hash slot as KEYS[1] (same room tag) but cannot be
-- named up front.
--
--   ARGV[1]   record key prefix of the room ('<p>:{<p>:<room>}:r:')
--
-- Returns the number of record names the index held. Versions keep counting from `ver`
-- and the log from `seq`; with low = seq + 1 every cursor from before the delete is
-- compacted (read_log raises CursorCompacted) rather than silently skipping ahead.
-- A record the index had already dropped (scan drops expired ones lazily) is past its
-- expiry, so Redis reclaims it by itself. UNLINK frees large values off the main thread.

local meta, index, log, registry, base = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local batch = 1000 -- keys per UNLINK: unpack() is limited to a few thousand values

local count = 0
while true do
  local names = redis.call('ZRANGE', index, count, count + batch - 1)
  if #names == 0 then break end
  for i, name in ipairs(names) do names[i] = base .. name end
  redis.call('UNLINK', unpack(names))
  count = count + #names
  if #names < batch then break end
end

local sets = redis.call('SMEMBERS', registry)
for first = 1, #sets, batch do
  redis.call('UNLINK', unpack(sets, first, math.min(first + batch - 1, #sets)))
end
redis.call('UNLINK', index, log, registry)

local seq = redis.call('HGET', meta, 'seq')
if seq then redis.call('HSET', meta, 'low', string.format('%.0f', tonumber(seq) + 1)) end
return count
