"""The ``arbiter`` command line."""
