"""Who listens on a TCP port of this host: the owner of each listening socket.

On Linux the kernel's socket tables (``/proc/net/tcp``, ``/proc/net/tcp6``) give each
listening socket's address and owner in one read each, without walking every process's
descriptors; elsewhere psutil's connection list, which names each socket's process.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any

import psutil

#: the kernel's TCP state number for LISTEN
LISTEN = "0A"
TABLES = {"/proc/net/tcp": socket.AF_INET, "/proc/net/tcp6": socket.AF_INET6}
#: the most of a socket table read: a table longer than this (tens of thousands of sockets,
#: which any account can open to push a listener past the cut) cannot be told from
TABLE_MOST = 8 << 20


def _address(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    # the kernel prints each 32-bit word in host order (little-endian here)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)) if family in (socket.AF_INET, socket.AF_INET6) else ""


def serves(listening: str, address: str) -> bool:
    """Whether a socket listening on ``listening`` takes connections to ``address``."""
    target = ipaddress.ip_address(address)
    where = ipaddress.ip_address(listening)
    if where == target or (where.is_unspecified and (where.version == target.version or where.version == 6)):
        return True
    mapped = getattr(where, "ipv4_mapped", None)
    return mapped is not None and (mapped == target or mapped.is_unspecified)


def parse_table(text: str, family: int, port: int) -> list[tuple[str, int]]:
    """(address, owner uid) of each socket in a ``/proc/net/tcp*`` table listening on ``port``."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 8 or parts[3] != LISTEN:
            continue
        addr, _, hex_port = parts[1].partition(":")
        try:
            if int(hex_port, 16) != port:
                continue
            out.append((_address(addr, family), int(parts[7])))
        except ValueError:
            continue
    return out


def listeners(address: str, port: int) -> list[dict[str, Any]] | None:
    """What ``arbiter_listeners`` answers."""
    found: list[tuple[str, int]] = []
    if sys.platform.startswith("linux"):
        for path, family in TABLES.items():
            try:
                with open(path, encoding="ascii", errors="replace") as fh:
                    text = fh.read(TABLE_MOST)
                    if len(text) >= TABLE_MOST:
                        return None  # the rest is unread: who listens cannot be told
                    found += parse_table(text, family, port)
            except FileNotFoundError:
                continue  # a kernel without IPv6
            except OSError:
                return None
    else:
        try:
            for conn in psutil.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    if conn.pid is None:
                        return None  # a socket whose process this account cannot see
                    found.append((conn.laddr.ip, psutil.Process(conn.pid).uids().real))
        except (psutil.Error, OSError):
            return None
    return [{"uid": uid, "address": where} for where, uid in found if serves(where, address)]
