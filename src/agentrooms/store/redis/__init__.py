"""The Redis backend (``redis://`` and ``rediss://``): :mod:`.backend` holds the store,
:mod:`.keys` the key layout, and one ``.lua`` file per operation the server-side code."""
