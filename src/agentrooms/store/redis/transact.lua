-- transact: check every compare, then apply every write, set op and append; all or nothing.
--
-- Touches only keys named in KEYS, all in the room's hash slot (see keys.py):
--   KEYS[1]                  room meta hash      (HINCRBY ver / seq)
--   KEYS[2]                  room scan index     (ZADD on put, ZREM on delete)
--   KEYS[3]                  room event log      (XADD <seq>-0)
--   KEYS[3+1 .. 3+C]         record of each compare, in compare order (HMGET)
--   KEYS[3+C+1 .. 3+C+W]     record of each write, in write order (DEL, HSET, PEXPIREAT)
--   KEYS[3+C+W+1 .. +S]      set of each set op, in order (ZADD NX 0 / ZREM)
--   KEYS[3+C+W+S+1]          the room's set registry (SADD / SREM), only when S > 0
--
-- ARGV[1]                    C, the number of compares
-- ARGV[2]                    S, the number of set ops (W and A follow from #KEYS, #ARGV)
--   then per compare, 1 each: 'v<version>' version equals | 'a' absent | 'p' present |
--                             'f<fence>' fence at most (decimal integers, >= 0)
--   then per write, 3 each:  name, value JSON ('' = delete: JSON text is never empty),
--                             options: '' or space-separated 't<ttl ms>', 'f<fence>'
--                             (the value's fencing token when not 0, computed by the
--                             caller with agentrooms' fence_of and stored as field f)
--                             and 'o': the value is a JSON object to which the field
--                             "outcome" is added, {"versions": {name: version, ...},
--                             "seqs": [seq, ...]}, the other puts' versions and the
--                             appends' sequence numbers (at most one write has it)
--   then per set op, 1 each: '+<member>' add (a member already there keeps its pick
--                             order) | '-<member>' remove (a member added again later is
--                             never-picked again)
--   then per append, 4 each: type, data JSON, author ('' = none: an author is never
--                             empty; stored as field 'a' only when given), addressees
--                             (stored form, '' = none; field 'r' only when given)
--
-- Returns one of
--   {0, now_ms, last_version, last_seq}  committed: of the P puts, put i (in write order)
--                                        got last_version - P + i; of the A appends,
--                                        append j got last_seq - A + j
--   {1, i, fence | false}                compare i (1-based) is the first stale fence;
--                                        false when its record is absent or expired
--   {2, i1, version1 | false, i2, ...}   every failing version/absent/present compare with
--                                        the record's current version (false = absent)
-- Nothing is written unless the reply starts with 0. Time is the server's (TIME); a
-- record whose expiry is at or before now is absent to every compare. Set ops are applied
-- in order after the writes: a set's key is in the registry exactly while it has members.

local C, S = tonumber(ARGV[1]), tonumber(ARGV[2])
local W = #KEYS - 3 - C - S
if S > 0 then W = W - 1 end
local A = (#ARGV - 2 - C - 3 * W - S) / 4
local meta, index, log = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function int(n)
  return string.format('%.0f', n)
end

-- a > b for canonical decimal integers given as strings, b non-negative (exact, any size)
local function greater(a, b)
  if string.byte(a, 1) == 45 then return false end -- '-'
  if #a ~= #b then return #a > #b end
  for k = 1, #a do
    local x, y = string.byte(a, k), string.byte(b, k)
    if x ~= y then return x > y end
  end
  return false
end

-- compares: read everything first, write nothing
local failed = {2}
for i = 1, C do
  local op, operand = string.sub(ARGV[2 + i], 1, 1), string.sub(ARGV[2 + i], 2)
  local rec = redis.call('HMGET', KEYS[3 + i], 'n', 'e', 'f')
  local version = rec[1]
  if version and rec[2] and tonumber(rec[2]) <= now then version = false end
  if op == 'f' then
    local fence = version and (rec[3] or '0')
    if not fence or greater(fence, operand) then return {1, i, fence} end
  elseif (op == 'v' and version ~= operand) or (op == 'a' and version)
      or (op == 'p' and not version) then
    failed[#failed + 1] = i
    failed[#failed + 1] = version
  end
end
if #failed > 1 then return failed end

local w0 = 2 + C -- ARGV index just before the first write
local s0 = w0 + 3 * W -- ARGV index just before the first set op
local a0 = s0 + S -- ARGV index just before the first append

local puts = 0
for j = 1, W do
  if ARGV[w0 + 3 * j - 1] ~= '' then puts = puts + 1 end
end
local version = 0
if puts > 0 then version = redis.call('HINCRBY', meta, 'ver', puts) - puts end
local seq = 0
if A > 0 then seq = redis.call('HINCRBY', meta, 'seq', A) - A end

-- the outcome record's value, now that every version and seq given is known
local outcome, recorded = nil, nil
for j = 1, W do
  if string.find(ARGV[w0 + 3 * j], 'o', 1, true) then outcome = j end
end
if outcome then
  local versions, given, seqs = {}, version, {}
  for j = 1, W do
    if ARGV[w0 + 3 * j - 1] ~= '' then
      given = given + 1
      if j ~= outcome then
        versions[#versions + 1] = cjson.encode(ARGV[w0 + 3 * j - 2]) .. ':' .. int(given)
      end
    end
  end
  for j = 1, A do seqs[j] = int(seq + j) end
  local value, rest = ARGV[w0 + 3 * outcome - 1], '}'
  if value ~= '{}' then rest = ',' .. string.sub(value, 2) end
  recorded = '{"outcome":{"versions":{' .. table.concat(versions, ',') .. '},"seqs":['
    .. table.concat(seqs, ',') .. ']}' .. rest
end

-- appends first: XADD is the one write that could be refused (an ID below the top)
local stamp = int(now)
for j = 1, A do
  local b = a0 + 4 * (j - 1)
  local entry = {'t', ARGV[b + 1], 'd', ARGV[b + 2], 'ms', stamp}
  if ARGV[b + 3] ~= '' then
    entry[#entry + 1], entry[#entry + 2] = 'a', ARGV[b + 3]
  end
  if ARGV[b + 4] ~= '' then
    entry[#entry + 1], entry[#entry + 2] = 'r', ARGV[b + 4]
  end
  redis.call('XADD', log, int(seq + j) .. '-0', unpack(entry))
end

local given = version
for j = 1, W do
  local key = KEYS[3 + C + j]
  local name, value, options = ARGV[w0 + 3 * j - 2], ARGV[w0 + 3 * j - 1], ARGV[w0 + 3 * j]
  redis.call('DEL', key) -- drops any previous expiry and fields with it
  if value == '' then
    redis.call('ZREM', index, name)
  else
    given = given + 1
    if j == outcome then value = recorded end
    local fields = {'v', value, 'n', int(given)}
    local at, fence = nil, nil
    if options ~= '' then
      at, fence = string.match(options, 't(%d+)'), string.match(options, 'f(%-?%d+)')
    end
    if fence then
      fields[#fields + 1] = 'f'
      fields[#fields + 1] = fence
    end
    if at then
      at = now + tonumber(at)
      fields[#fields + 1] = 'e'
      fields[#fields + 1] = int(at)
    end
    redis.call('HSET', key, unpack(fields))
    if at then redis.call('PEXPIREAT', key, int(at)) end -- so Redis reclaims the memory
    redis.call('ZADD', index, 0, name)
  end
end

local registry = KEYS[4 + C + W + S]
for j = 1, S do
  local key, op = KEYS[3 + C + W + j], ARGV[s0 + j]
  if string.byte(op, 1) == 43 then -- '+'
    if redis.call('ZADD', key, 'NX', 0, string.sub(op, 2)) == 1 then
      redis.call('SADD', registry, key)
    end
  elseif redis.call('ZREM', key, string.sub(op, 2)) == 1 and redis.call('EXISTS', key) == 0 then
    redis.call('SREM', registry, key)
  end
end

return {0, now, version + puts, seq + A}
