-- Migration 0008: whom each event is addressed to.
--
-- events.recipients holds the addressees the append named (Append.to, Append.to_roles)
-- in their stored form, {"to": [agents], "roles": [roles]} as JSON text
-- (agentrooms.store.types.encode_recipients); NULL when it named none, and for events
-- appended before this migration. Text, not jsonb: the store only hands it back; a
-- nullable column without a default is added without rewriting the table.
--
-- transact() and transact_recording() take the addressees as one more array
-- (p_recipients, parallel to p_types), which CREATE OR REPLACE cannot add: the old ones
-- are dropped here, and migrate() creates the new ones from functions/*.sql in the same
-- transaction. On a fresh schema they do not exist yet.

ALTER TABLE events ADD COLUMN recipients text;

DROP FUNCTION IF EXISTS transact_recording(
    text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[],
    integer[], text[], integer[], text[], text[], text[], integer[], text[], text[], text[],
    text[]
);

DROP FUNCTION IF EXISTS transact(
    text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[],
    integer[], text[], integer[], text[], text[], text[], integer[], text[], text[], text[]
);
