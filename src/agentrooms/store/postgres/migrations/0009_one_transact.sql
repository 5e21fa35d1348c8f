-- Migration 0009: one transact() for every batch.
--
-- transact() takes the outcome keys that transact_recording() took (p_outcome_keys, a
-- last argument defaulting to NULL) and records the outcomes itself, so
-- transact_recording() is gone. CREATE OR REPLACE cannot add an argument: the old
-- transact() and transact_recording() are dropped here, and migrate() creates the new
-- transact() from functions/transact.sql in the same transaction. On a fresh schema they
-- do not exist yet.

DROP FUNCTION IF EXISTS transact_recording(
    text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[],
    integer[], text[], integer[], text[], text[], text[], integer[], text[], text[], text[],
    text[], text[]
);

DROP FUNCTION IF EXISTS transact(
    text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[],
    integer[], text[], integer[], text[], text[], text[], integer[], text[], text[], text[],
    text[]
);
