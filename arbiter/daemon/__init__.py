"""The imperative shell: threads, plugins, SQLite, the socket (see :mod:`.core`)."""
