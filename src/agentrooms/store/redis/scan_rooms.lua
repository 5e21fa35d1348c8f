-- scan_rooms: scan.lua for many rooms in one call, the same bounds and limit for each,
-- all in one snapshot (one server, not a cluster: the rooms' keys are in many slots).
--
--   KEYS[i]     room i's scan index
--   ARGV[1], ARGV[2], ARGV[3]: lower bound, upper bound and limit, as scan.lua's ARGV[2..4]
--   ARGV[3 + i] room i's record key prefix
--
-- Returns {now_ms, page1, page2, ...}, each page {next_after | false, name1, version1,
-- expires1 | false, value1, ...} as scan.lua's reply after its now_ms (stale index
-- members skipped and removed the same way).

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
  if more then out[1] = last end
  return out
end

local out = {now}
for i, index in ipairs(KEYS) do
  out[i + 1] = page(index, ARGV[3 + i])
end
return out
