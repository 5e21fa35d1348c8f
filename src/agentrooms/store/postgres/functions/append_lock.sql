-- The key of a room's append lock (transaction-scoped, exclusive): transact() takes it
-- just before the room's row when it appends, so appenders queue in the lock manager,
-- one woken per commit, rather than all racing for the row at each commit.
-- No SET clause, so that it is inlined: see room_lock().
CREATE OR REPLACE FUNCTION append_lock(p_room text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT hashtextextended('agentrooms.append:' || current_schema() || ':' || p_room, 0)
$$;
