-- The key of a room's advisory lock (transaction-scoped): every transact() holds it
-- shared, delete_room() exclusively, so a room is deleted between transacts, never in
-- the middle of one. The schema is part of the key: stores in other schemas of the same
-- database do not wait for each other.
--
-- It, append_lock() and notify_channel() take the schema from current_schema(), their
-- caller's: every caller is a function of this schema (which runs with SET search_path
-- FROM CURRENT) or a session of this store (its search_path is the schema). They have no
-- SET clause of their own so that the planner inlines them: a SQL function with one is
-- called through the function manager, setting and restoring search_path on every call.
CREATE OR REPLACE FUNCTION room_lock(p_room text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT hashtextextended('agentrooms.room:' || current_schema() || ':' || p_room, 0)
$$;
