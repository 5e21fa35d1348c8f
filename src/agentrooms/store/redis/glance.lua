-- glance: one room's newest seq, the sizes of some of its sets and some of its records, as
-- one snapshot, with the server's clock (Store.glance pipelines one call per room).
--
-- Touches only keys named in KEYS (read only):
--   KEYS[1]               the room's meta hash (see keys.py)
--   KEYS[2 .. 1 + S]      set keys, in the caller's order
--   KEYS[2 + S .. ]       record hashes, in the caller's order
-- ARGV[1]: S, how many set keys
--
-- Returns {now_ms, seq, size1 .. sizeS, version1, expires1, value1, version2, ...}: three
-- slots per record as read.lua's (all false when absent or expired). seq is 0 for a room
-- that never appended.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sets = tonumber(ARGV[1])
local out = {now, tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')}
for i = 2, 1 + sets do
  out[#out + 1] = redis.call('ZCARD', KEYS[i])
end
for i = 2 + sets, #KEYS do
  local rec = redis.call('HMGET', KEYS[i], 'n', 'e', 'v')
  local at = #out
  if rec[1] and not (rec[2] and tonumber(rec[2]) <= now) then
    out[at + 1], out[at + 2], out[at + 3] = rec[1], rec[2], rec[3]
  else
    out[at + 1], out[at + 2], out[at + 3] = false, false, false
  end
end
return out
