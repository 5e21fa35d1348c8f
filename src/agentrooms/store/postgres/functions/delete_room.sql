-- delete_room: delete every record, set member and event of the room in one transaction,
-- keeping its counters: versions come from a store-wide sequence, and the log's sequence
-- continues, with everything up to it trimmed (low = seq + 1), so an old cursor gets
-- CursorCompacted. Holds the room's advisory lock exclusively, so no transact is half
-- done in the room meanwhile (one could otherwise create a key this delete cannot see
-- yet while the delete waits for another key it locked); compare_and_set, set_pick and
-- trim_log need not take it: they neither create keys nor wait while holding a lock.
CREATE OR REPLACE FUNCTION delete_room(p_room text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(room_lock(p_room));
    DELETE FROM records WHERE room = p_room;
    DELETE FROM set_members WHERE room = p_room;
    UPDATE rooms SET low = seq + 1 WHERE room = p_room;
    DELETE FROM events WHERE room = p_room;
END
$$;
