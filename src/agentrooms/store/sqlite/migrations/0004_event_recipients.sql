-- Migration 0004: whom each event is addressed to.
--
-- events.recipients  The addressees the append named (Append.to, Append.to_roles) in
--                    their stored form, {"to": [agents], "roles": [roles]} as JSON text
--                    (agentrooms.store.types.encode_recipients); NULL when it named none,
--                    and for events appended before this migration.
-- Applied by agentrooms.store.sqlite.sql.migrate inside BEGIN IMMEDIATE. Adding a
-- nullable column without a default rewrites no row.

ALTER TABLE events ADD COLUMN recipients TEXT;
