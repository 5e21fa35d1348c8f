-- Migration 0003: who appended each event.
--
-- events.author  The agent the append named as its author (Append.author), NULL when it
--                named none; events appended before this migration read as NULL.
-- Applied by agentrooms.store.sqlite.sql.migrate inside BEGIN IMMEDIATE. Adding a
-- nullable column without a default rewrites no row.

ALTER TABLE events ADD COLUMN author TEXT;
