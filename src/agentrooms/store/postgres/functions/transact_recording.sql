-- transact_recording: transact() for a batch some of whose items record their outcome (a
-- PutOutcome): p_outcome_keys holds, per item, the key of its outcome record, or NULL.
-- Once transact() has applied the batch, each applied item's outcome record gets the field
-- "outcome" added to its JSON object, in the same transaction: {"versions": {key: version}
-- of the item's other puts, "seqs": [...] of its appends}, as the caller is told them.
-- Its own version stays the one transact() gave it.
CREATE OR REPLACE FUNCTION transact_recording(
    p_room         text,
    p_cmp_bounds   integer[],
    p_cmp_keys     text[],
    p_cmp_kinds    text[],
    p_cmp_args     numeric[],
    p_put_bounds   integer[],
    p_put_keys     text[],
    p_put_values   text[],
    p_put_ttls     bigint[],
    p_del_bounds   integer[],
    p_del_keys     text[],
    p_set_bounds   integer[],
    p_set_names    text[],
    p_set_members  text[],
    p_set_kinds    text[],
    p_app_bounds   integer[],
    p_types        text[],
    p_datas        text[],
    p_authors      text[],
    p_recipients   text[],
    p_outcome_keys text[],
    OUT now               double precision,
    OUT versions          bigint[],
    OUT first_seqs        bigint[],
    OUT stale_at          bigint[],
    OUT stale_current     numeric[],
    OUT conflict_items    integer[],
    OUT conflict_keys     text[],
    OUT conflict_versions bigint[]
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_done text;
BEGIN
    SELECT t.now, t.versions, t.first_seqs, t.stale_at, t.stale_current,
           t.conflict_items, t.conflict_keys, t.conflict_versions
      INTO now, versions, first_seqs, stale_at, stale_current,
           conflict_items, conflict_keys, conflict_versions
      FROM transact(p_room, p_cmp_bounds, p_cmp_keys, p_cmp_kinds, p_cmp_args,
                    p_put_bounds, p_put_keys, p_put_values, p_put_ttls,
                    p_del_bounds, p_del_keys, p_set_bounds, p_set_names, p_set_members,
                    p_set_kinds, p_app_bounds, p_types, p_datas, p_authors,
                    p_recipients) AS t;
    FOR i IN 1 .. cardinality(p_outcome_keys) LOOP
        CONTINUE WHEN p_outcome_keys[i] IS NULL OR stale_at[i] IS NOT NULL
                   OR i = ANY (coalesce(conflict_items, '{}'));
        SELECT json_build_object(
                   'versions', coalesce(
                       (SELECT json_object_agg(p_put_keys[j], versions[j] ORDER BY j)
                          FROM generate_series(p_put_bounds[i] + 1, p_put_bounds[i + 1]) AS j
                         WHERE p_put_keys[j] <> p_outcome_keys[i]),
                       '{}'::json),
                   'seqs', coalesce(
                       (SELECT json_agg(first_seqs[i] + k ORDER BY k)
                          FROM generate_series(0, p_app_bounds[i + 1] - p_app_bounds[i] - 1)
                               AS k),
                       '[]'::json))::text
          INTO v_done;
        UPDATE records
           SET value = '{"outcome":' || v_done
                       || CASE WHEN value = '{}' THEN '}' ELSE ',' || substr(value, 2) END
         WHERE room = p_room AND key = p_outcome_keys[i];
    END LOOP;
END
$$;
