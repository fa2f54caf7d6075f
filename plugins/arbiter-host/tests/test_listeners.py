"""Who owns the socket listening on a port: the kernel's tables read, and a real socket found."""

from __future__ import annotations

import os
import socket

import pytest

from arbiter_host.listeners import listeners, parse_table, serves

TABLE = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1 1 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1 0
   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0
   3: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0
"""


def test_listening_sockets_on_the_port_with_their_owners() -> None:
    # a connected socket on the same port is no listener; another port is not asked about
    assert parse_table(TABLE, socket.AF_INET, 8080) == [("127.0.0.1", 65534), ("0.0.0.0", 1000)]


def test_which_listening_address_takes_a_connection() -> None:
    assert serves("127.0.0.1", "127.0.0.1") and serves("0.0.0.0", "127.0.0.1") and serves("::", "127.0.0.1")
    assert serves("::ffff:127.0.0.1", "127.0.0.1") and serves("::", "::1")
    assert not serves("127.0.0.2", "127.0.0.1") and not serves("0.0.0.0", "::1")


def test_a_real_socket_is_found_with_its_owner() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listeners("127.0.0.1", port) == [{"uid": os.geteuid(), "address": "127.0.0.1"}]
    assert listeners("127.0.0.1", port) == []


def test_a_table_longer_than_is_read_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tens of thousands of sockets could push a listener past the part read: then who
    listens cannot be told, and nothing that needs it is sent."""
    import importlib

    module = importlib.import_module("arbiter_host.listeners")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listeners("127.0.0.1", port)
        monkeypatch.setattr(module, "TABLE_MOST", 160)  # shorter than the table's header and one row
        assert listeners("127.0.0.1", port) is None
