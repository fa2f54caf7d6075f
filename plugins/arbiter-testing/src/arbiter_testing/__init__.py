"""Test-only arbiter kinds: the ``fake`` reader, driven by a JSON file the test writes;
and :func:`run_as`, for tests that check what another account may do.

Install this distribution only where tests run; it registers through the ``arbiter``
entry point group like any plugin.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiter.plugin import hookimpl

from arbiter_testing.fake_reader import FakeReader, write_state
from arbiter_testing.users import ChildFailed, run_as

__all__ = ["ChildFailed", "FakeReader", "arbiter_register_readers", "run_as", "write_state"]


@hookimpl
def arbiter_register_readers(register: Callable[[str, type], None]) -> None:
    register("fake", FakeReader)
