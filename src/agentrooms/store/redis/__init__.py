"""The Redis backend (``redis://`` and ``rediss://``): :mod:`.backend` holds the store,
:mod:`.scripts` the scripts' arguments and replies, :mod:`.keys` the key layout,
:mod:`.config` the URL parameters, and one ``.lua`` file per operation the server-side
code."""
