-- set_pick: hand out the members of a set picked least recently, and mark them picked.
--
-- Touches only keys named in KEYS, both in the room's hash slot (see keys.py):
--   KEYS[1]   room meta hash (HINCRBY pick: the room's pick stamp)
--   KEYS[2]   the set (sorted set, score = pick stamp of the member's last pick, 0 for a
--             member never picked; ZRANGE BYSCORE LIMIT, ZADD XX)
--   ARGV[1]   count: at most this many members
--
-- Returns the members picked, in order: first the never-picked ones in member order
-- (score 0, ties broken by byte order = Unicode code point order), then the least
-- recently picked. Each is re-scored with a fresh stamp, increasing in reply order, so
-- the next call hands out others while the set has enough: concurrent callers never get
-- the same member. O(log n + count); the meta hash is not touched when the set is empty.

local set = KEYS[2]
local picked = redis.call('ZRANGE', set, '-inf', '+inf', 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
local n = #picked
if n == 0 then return picked end
local stamp = redis.call('HINCRBY', KEYS[1], 'pick', n) - n
local chunk = 1000 -- members per ZADD: unpack() is limited to a few thousand values
for first = 1, n, chunk do
  local args = {}
  for i = first, math.min(first + chunk - 1, n) do
    args[#args + 1] = string.format('%.0f', stamp + i)
    args[#args + 1] = picked[i]
  end
  redis.call('ZADD', set, 'XX', unpack(args))
end
return picked
