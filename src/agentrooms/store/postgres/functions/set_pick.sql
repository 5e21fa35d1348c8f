-- set_pick: up to p_count members of the room's set, least recently picked first (never
-- picked, pick 0, first, in member order), each marked picked with the next
-- set_pick_order number in that order; returned with those numbers.
--
-- Concurrent pickers get different members, and a picker never waits: it walks the set
-- in pick order (the set_members_pick_order index, as of the walk's snapshot) and takes
-- each member with FOR UPDATE SKIP LOCKED only if its pick number is still the one the
-- walk saw, so it skips a member another picker holds (locked) and one another picker
-- took after the walk began (pick number changed; on a row updated between this
-- statement's snapshot and its lock, the lock re-checks the condition on the newest
-- version). A plain ORDER BY ... LIMIT ... FOR UPDATE SKIP LOCKED would hand out that
-- second kind twice. Cost: O(log n + rows walked), rows walked = p_count + skipped ones.
CREATE OR REPLACE FUNCTION set_pick(
    p_room text, p_name text, p_count integer, OUT member text, OUT pick bigint
) RETURNS SETOF record
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_seen  record;
    v_taken integer := 0;
BEGIN
    IF p_count < 1 THEN
        RETURN;
    END IF;
    FOR v_seen IN
        SELECT s.member, s.pick
          FROM set_members AS s
         WHERE s.room = p_room AND s.name = p_name AND s.pick >= 0  -- the index's predicate
         ORDER BY s.pick, s.member
    LOOP
        PERFORM
           FROM set_members AS m
          WHERE m.room = p_room AND m.name = p_name AND m.member = v_seen.member
            AND m.pick = v_seen.pick
            FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        UPDATE set_members AS m
           SET pick = nextval('set_pick_order')
         WHERE m.room = p_room AND m.name = p_name AND m.member = v_seen.member
        RETURNING m.member, m.pick INTO member, pick;
        RETURN NEXT;
        v_taken := v_taken + 1;
        EXIT WHEN v_taken >= p_count;
    END LOOP;
END
$$;
