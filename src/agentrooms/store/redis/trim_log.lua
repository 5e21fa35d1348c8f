-- trim_log: drop a room's events below a sequence number, never past the newest event.
--
-- Touches only keys named in KEYS:
--   KEYS[1]   room meta hash (HMGET seq low; HSET low)
--   KEYS[2]   room event log (stream, entry ID <seq>-0; XTRIM MINID, exact)
--   ARGV[1]   before: decimal sequence number; events with seq < before are dropped
--
-- Returns low, the first sequence number still readable: min(before, seq + 1), and never
-- lower than it was. Idempotent.

local m = redis.call('HMGET', KEYS[1], 'seq', 'low')
local seq, low = tonumber(m[1] or '0'), tonumber(m[2] or '1')
local target = math.min(tonumber(ARGV[1]), seq + 1)
if target > low then
  local id = string.format('%.0f', target)
  redis.call('XTRIM', KEYS[2], 'MINID', id)
  redis.call('HSET', KEYS[1], 'low', id)
  low = target
end
return low
