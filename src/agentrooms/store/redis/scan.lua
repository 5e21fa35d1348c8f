-- scan: one page of a room's records in key order (UTF-8 byte order), as one snapshot.
--
--   KEYS[1]   room scan index (sorted set, score 0; ZRANGEBYLEX, lazy ZREM)
-- Also reads records discovered through the index, ARGV[1] .. member: they are in the
-- same hash slot as KEYS[1] (same room tag) but cannot be named up front.
--
--   ARGV[1]   record key prefix of the room ('<p>:{<p>:<room>}:r:')
--   ARGV[2]   lower bound in ZRANGEBYLEX form: '-', '[<prefix>' or '(<after>'
--   ARGV[3]   upper bound in ZRANGEBYLEX form: '+' or '(<prefix>\xff' (0xFF is never
--             part of UTF-8, so every key starting with <prefix> sorts below it)
--   ARGV[4]   limit: at most this many records
--
-- Returns {now_ms, next_after | false, name1, version1, expires1 | false, value1, ...}.
-- next_after is the last key examined when more keys lie within the bounds, else false.
-- Index members whose record is gone (reclaimed by Redis after its expiry) or expired are
-- skipped and removed from the index; a later put adds them back.

local index, base, lo, hi = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local out = {now, false}
local found, last, more = 0, nil, false
while true do
  local want = limit - found + 1 -- one more than needed, to learn whether more follow
  local batch = redis.call('ZRANGEBYLEX', index, lo, hi, 'LIMIT', 0, want)
  for _, name in ipairs(batch) do
    if found == limit then
      more = true
      break
    end
    local rec = redis.call('HMGET', base .. name, 'n', 'e', 'v')
    if rec[1] and not (rec[2] and tonumber(rec[2]) <= now) then
      out[#out + 1] = name
      out[#out + 1] = rec[1]
      out[#out + 1] = rec[2]
      out[#out + 1] = rec[3]
      found = found + 1
    else
      redis.call('ZREM', index, name)
    end
    last = name
  end
  if more or #batch < want then break end
  lo = '(' .. last
end
if more then out[2] = last end
return out
