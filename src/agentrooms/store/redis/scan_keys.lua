-- scan_keys: scan_rooms.lua without the records, for one room or many: each room's live
-- keys in a range, the same bounds and limit for each, all in one snapshot (one server;
-- on a cluster one room per call, as a script's keys share a slot).
--
--   KEYS[i]     room i's scan index
--   ARGV[1], ARGV[2], ARGV[3]: lower bound, upper bound and limit, as scan_rooms.lua's
--   ARGV[3 + i] room i's record key prefix
--
-- Returns {page1, page2, ...}, each {next_after | false, name1, name2, ...} (stale index
-- members skipped and removed as scan_rooms.lua does). A record is live when it exists
-- and has not expired: its version and expiry are read, its value is not.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[3])

local function page(index, base)
  local lo, hi = ARGV[1], ARGV[2]
  local out = {false}
  local found, last, more = 0, nil, false
  while true do
    local want = limit - found + 1
    local batch = redis.call('ZRANGEBYLEX', index, lo, hi, 'LIMIT', 0, want)
    for _, name in ipairs(batch) do
      if found == limit then
        more = true
        break
      end
      local rec = redis.call('HMGET', base .. name, 'n', 'e')
      if rec[1] and not (rec[2] and tonumber(rec[2]) <= now) then
        out[#out + 1] = name
        found = found + 1
      else
        redis.call('ZREM', index, name)
      end
      last = name
    end
    if more or #batch < want then break end
    lo = '(' .. last
  end
  if more then out[1] = last end
  return out
end

local out = {}
for i, index in ipairs(KEYS) do
  out[i] = page(index, ARGV[3 + i])
end
return out
