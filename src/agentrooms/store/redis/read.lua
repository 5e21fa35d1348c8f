-- read: several records of one room as one snapshot, with the server's clock.
--
-- Touches only keys named in KEYS (read only):
--   KEYS[1 .. N]   record hashes (see keys.py), in the caller's order
-- ARGV: none
--
-- Returns {now_ms, version1, expires1, value1, version2, ...}: three slots per key, all
-- false when the record is absent or expired (expiry at or before now); expires is false
-- for a record without a TTL. Versions and expiries are decimal strings.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for i, key in ipairs(KEYS) do
  local rec = redis.call('HMGET', key, 'n', 'e', 'v')
  if rec[1] and not (rec[2] and tonumber(rec[2]) <= now) then
    out[3 * i - 1], out[3 * i], out[3 * i + 1] = rec[1], rec[2], rec[3]
  else
    out[3 * i - 1], out[3 * i], out[3 * i + 1] = false, false, false
  end
end
return out
