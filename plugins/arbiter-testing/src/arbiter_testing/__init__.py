"""Test-only arbiter kinds: the ``fake`` reader, driven by a JSON file the test writes.

Install this distribution only where tests run; it registers through the ``arbiter``
entry point group like any plugin.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiter.plugin import hookimpl

from arbiter_testing.fake_reader import FakeReader, write_state

__all__ = ["FakeReader", "write_state", "arbiter_register_readers"]


@hookimpl
def arbiter_register_readers(register: Callable[[str, type], None]) -> None:
    register("fake", FakeReader)
