"""arbiter source kinds: ``jsonl`` and ``log`` (watched files), ``exec`` (a command's rate)
and ``on_exec`` (a phase while a process runs).

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from arbiter.plugin import Register, hookimpl

from arbiter_sources.command import ExecSource, OnExecSource
from arbiter_sources.jsonl import JsonlSource
from arbiter_sources.log import LogSource

__all__ = ["ExecSource", "JsonlSource", "LogSource", "OnExecSource", "arbiter_register_sources"]


@hookimpl
def arbiter_register_sources(register: Register) -> None:
    register("jsonl", JsonlSource)
    register("log", LogSource)
    register("exec", ExecSource)
    register("on_exec", OnExecSource)
