-- read_log: events after a sequence number, in order, or the news that they were trimmed.
--
-- Touches only keys named in KEYS (read only):
--   KEYS[1]   room meta hash (HGET low)
--   KEYS[2]   room event log (stream, entry ID <seq>-0; XRANGE)
--   ARGV[1]   after: decimal sequence number (events with seq > after are wanted)
--   ARGV[2]   limit: at most this many events
--
-- Returns {0, low} when events after `after` were trimmed (after + 1 < low: the caller's
-- cursor was compacted), else {1, entries} with entries as XRANGE gives them:
-- {{'<seq>-0', {'t', type, 'd', data JSON, 'ms', time ms[, 'a', author][, 'r', to]}}, ...}.

local low = tonumber(redis.call('HGET', KEYS[1], 'low') or '1')
if tonumber(ARGV[1]) + 1 < low then return {0, low} end
return {1, redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])}
