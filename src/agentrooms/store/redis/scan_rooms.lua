-- scan_rooms: one page of the records (or of the keys only) of each of one or more rooms
-- in key order (UTF-8 byte order), the same bounds and limit for each, all in one
-- snapshot. On one server any rooms; on a cluster one room per call (a script's keys
-- share a slot). Store.scan is this script over one room, Store.scan_keys this script
-- without the values.
--
--   KEYS[i]     room i's scan index (sorted set, score 0; ZRANGEBYLEX, lazy ZREM)
--   ARGV[1]     lower bound in ZRANGEBYLEX form: '-', '[<prefix>' or '(<after>'
--   ARGV[2]     upper bound in ZRANGEBYLEX form: '+' or '(<prefix>\xff' (0xFF is never
--               part of UTF-8, so every key starting with <prefix> sorts below it)
--   ARGV[3]     limit: at most this many records per room
--   ARGV[4]     'r': each record's key, version, expiry and value; 'k': its key alone
--               (its version and expiry are read to judge it live, its value is not)
--   ARGV[4 + i] room i's record key prefix ('<p>:{<p>:<room>}:r:'): the records found
--               through its index are in the index's hash slot (same room tag) but
--               cannot be named up front
--
-- Returns {now_ms, page1, page2, ...}, each page {next_after | false, name1, version1,
-- expires1 | false, value1, ...} ('r') or {next_after | false, name1, name2, ...} ('k').
-- next_after is the last key examined when more keys lie within the bounds, else false.
-- Index members whose record is gone (reclaimed by Redis after its expiry) or expired are
-- skipped and removed from the index; a later put adds them back.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[3])
local values = ARGV[4] == 'r'

local function page(index, base)
  local lo, hi = ARGV[1], ARGV[2]
  local out = {false}
  local found, last, more = 0, nil, false
  while true do
    local want = limit - found + 1 -- one more than needed, to learn whether more follow
    local batch = redis.call('ZRANGEBYLEX', index, lo, hi, 'LIMIT', 0, want)
    for _, name in ipairs(batch) do
      if found == limit then
        more = true
        break
      end
      local rec
      if values then
        rec = redis.call('HMGET', base .. name, 'n', 'e', 'v')
      else
        rec = redis.call('HMGET', base .. name, 'n', 'e')
      end
      if rec[1] and not (rec[2] and tonumber(rec[2]) <= now) then
        out[#out + 1] = name
        if values then
          out[#out + 1] = rec[1]
          out[#out + 1] = rec[2]
          out[#out + 1] = rec[3]
        end
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
  out[i + 1] = page(index, ARGV[4 + i])
end
return out
