-- The fencing token of a record's value: the integer "fence" field of a JSON object,
-- else 0. The same rule as agentrooms.store.types.fence_of (a float or a boolean is not a
-- token); numeric, because a JSON integer can be larger than bigint.
CREATE OR REPLACE FUNCTION fence_of(value text) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CASE
               WHEN json_typeof(j) = 'object'
                AND json_typeof(j -> 'fence') = 'number'
                AND (j ->> 'fence') ~ '^-?[0-9]+$'
               THEN (j ->> 'fence')::numeric
               ELSE 0
           END
      FROM (SELECT value::json AS j) AS parsed
$$;
