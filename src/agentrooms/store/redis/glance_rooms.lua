-- glance_rooms: glance.lua for many rooms in one call, each room as glance.lua reads it,
-- all in one snapshot (one server, not a cluster: the rooms' keys are in many slots).
--
--   KEYS: per room, in the caller's order: its meta hash, then S set keys, then K record
--         hashes (1 + S + K keys per room)
--   ARGV[1]: S, ARGV[2]: K
--
-- Returns {now_ms, then per room: seq, size1 .. sizeS, version1, expires1, value1, ...}:
-- 1 + S + 3K slots per room, as glance.lua's reply after its now_ms.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sets, records = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {now}
for base = 0, #KEYS - 1, 1 + sets + records do
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[base + 1], 'seq') or '0')
  for i = base + 2, base + 1 + sets do
    out[#out + 1] = redis.call('ZCARD', KEYS[i])
  end
  for i = base + 2 + sets, base + 1 + sets + records do
    local rec = redis.call('HMGET', KEYS[i], 'n', 'e', 'v')
    local at = #out
    if rec[1] and not (rec[2] and tonumber(rec[2]) <= now) then
      out[at + 1], out[at + 2], out[at + 3] = rec[1], rec[2], rec[3]
    else
      out[at + 1], out[at + 2], out[at + 3] = false, false, false
    end
  end
end
return out
