"""The SQLite backend: the embedded default store (``sqlite:///path.db``).

``backend.py`` is the :class:`~agentrooms.store.base.Store`; ``worker.py`` the thread
that owns the connection; ``engine.py`` its transactions, retries and error seam;
``operations.py`` the primitives over ``queries.sql``; ``watchers.py`` the coroutines
waiting in ``watch`` and how the thread wakes them; ``sql.py`` loads the SQL and applies
``migrations/``, which hold the schema.
"""
