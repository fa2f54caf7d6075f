"""The daemon's operations, as the command line, the socket and the HTTP listener name them.

:mod:`arbiter.api.ops` holds the names and rights of every operation; the daemon's table of
them, :class:`arbiter.daemon.api.NodeApi`, carries each one out.  This package imports only
the standard library: every CLI command that asks the daemon imports it.
"""
