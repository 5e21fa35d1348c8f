-- trim_log: drop the room's events before p_before (capped at the newest event + 1) and
-- return the first sequence number still readable, which never decreases. Locks the
-- room's row, so it waits for appends in flight and the delete sees every one of them.
CREATE OR REPLACE FUNCTION trim_log(p_room text, p_before bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_low bigint;
BEGIN
    UPDATE rooms SET low = greatest(low, least(p_before, seq + 1))
     WHERE room = p_room
    RETURNING low INTO v_low;
    IF NOT FOUND THEN
        RETURN 1;  -- nothing was ever appended
    END IF;
    DELETE FROM events WHERE room = p_room AND seq < v_low;
    RETURN v_low;
END
$$;
