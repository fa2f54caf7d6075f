"""arbiter reader kinds: ``cpu_time``, a CPU stand-in for a GPU reader.

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiter.plugin import hookimpl

from arbiter_readers.cpu_time import CpuTimeReader

__all__ = ["CpuTimeReader", "arbiter_register_readers"]


@hookimpl
def arbiter_register_readers(register: Callable[[str, type], None]) -> None:
    register("cpu_time", CpuTimeReader)
