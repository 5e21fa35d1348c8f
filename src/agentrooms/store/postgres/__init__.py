"""The PostgreSQL backend (``postgresql://``): :mod:`.backend` holds the store,
:mod:`.batches` how queued appending transacts are sent together, :mod:`.config` the URL
parameters, :mod:`.sql` the SQL files (``queries.sql``, ``migrations/``, ``functions/``)
and migrate."""
