-- glance_rooms: the newest seq, the sizes of some sets and some records of each of one or
-- more rooms, all in one snapshot, with the server's clock. On one server any rooms; on a
-- cluster one room per call (a script's keys share a slot).
--
-- Touches only keys named in KEYS (read only):
--   KEYS: per room, in the caller's order: its meta hash, then S set keys, then K record
--         hashes (1 + S + K keys per room)
--   ARGV[1]: S, ARGV[2]: K
--
-- Returns {now_ms, then per room: seq, size1 .. sizeS, version1, expires1, value1, ...}:
-- 1 + S + 3K slots per room, three per record as read.lua's (all false when absent or
-- expired). seq is 0 for a room that never appended.

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
