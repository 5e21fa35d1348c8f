-- Migration 0007: who appended each event.
--
-- events.author is the agent the append named as its author (Append.author), NULL when
-- it named none; events appended before this migration read as NULL. A nullable column
-- without a default is added without rewriting the table.
--
-- transact() and transact_recording() take the authors as one more array (p_authors,
-- parallel to p_types), which CREATE OR REPLACE cannot add: the old ones are dropped
-- here, and migrate() creates the new ones from functions/*.sql in the same transaction.
-- On a fresh schema they do not exist yet.

ALTER TABLE events ADD COLUMN author text;

DROP FUNCTION IF EXISTS transact_recording(
    text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[],
    integer[], text[], integer[], text[], text[], text[], integer[], text[], text[], text[]
);

DROP FUNCTION IF EXISTS transact(
    text, integer[], text[], text[], numeric[], integer[], text[], text[], bigint[],
    integer[], text[], integer[], text[], text[], text[], integer[], text[], text[]
);
