"""The PostgreSQL backend (``postgresql://``): see :mod:`agentrooms.store.postgres.backend`."""
