"""arbiter source kinds: ``jsonl``, a watched JSON-lines file (progress and phase).

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from collections.abc import Callable

from arbiter.plugin import hookimpl

from arbiter_sources.jsonl import JsonlSource

__all__ = ["JsonlSource", "arbiter_register_sources"]


@hookimpl
def arbiter_register_sources(register: Callable[[str, type], None]) -> None:
    register("jsonl", JsonlSource)
