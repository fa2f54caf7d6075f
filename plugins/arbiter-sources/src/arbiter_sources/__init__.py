"""arbiter source kinds: ``jsonl`` and ``log`` (watched files), ``exec`` (a command's rate),
``on_exec`` (a phase while a process runs), the busy probes ``http_count`` (work an HTTP
answer lists), ``http_value`` (a value in a JSON answer), ``prometheus`` (a sum of samples of a
``/metrics`` answer) and ``vram`` (VRAM above a level), and ``websocket`` (a tenant's events, as
wake-ups).

Registered through the ``arbiter`` entry point group; imports only :mod:`arbiter.plugin`.
"""

from __future__ import annotations

from arbiter.plugin import Register, hookimpl
from arbiter_sources.command import ExecSource, OnExecSource
from arbiter_sources.http_count import HttpCountSource
from arbiter_sources.http_value import HttpValueSource, PrometheusSource
from arbiter_sources.jsonl import JsonlSource
from arbiter_sources.log import LogSource
from arbiter_sources.vram import VramSource
from arbiter_sources.websocket import WebsocketSource

__all__ = [
    "ExecSource",
    "HttpCountSource",
    "HttpValueSource",
    "JsonlSource",
    "LogSource",
    "OnExecSource",
    "PrometheusSource",
    "VramSource",
    "WebsocketSource",
    "arbiter_register_sources",
]


@hookimpl
def arbiter_register_sources(register: Register) -> None:
    register("jsonl", JsonlSource)
    register("log", LogSource)
    register("exec", ExecSource)
    register("on_exec", OnExecSource)
    register("http_count", HttpCountSource)
    register("http_value", HttpValueSource)
    register("prometheus", PrometheusSource)
    register("vram", VramSource)
    register("websocket", WebsocketSource)
