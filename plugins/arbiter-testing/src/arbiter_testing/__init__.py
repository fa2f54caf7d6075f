"""Test-only arbiter kinds: the ``fake`` reader, driven by a JSON file the test writes; the
``fake_profile`` translator, whose device is a JSON file;
:func:`run_as`, for tests that check what another account may do; and fake programs that
hold VRAM (an LLM server, a diffusion server) serving their real APIs' shapes on 127.0.0.1,
writing their VRAM to the fake reader's file through a :class:`VramBoard`; a
:class:`ModelServer` that holds real device memory on a GPU (or board memory without one);
and a fake CUDA driver library and ``cuda-checkpoint`` utility (:mod:`arbiter_testing.fake_cuda`).

Install this distribution only where tests run; it registers through the ``arbiter``
entry point group like any plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.plugin import hookimpl
from arbiter_testing.fake_profile import FakeProfileTranslator
from arbiter_testing.fake_reader import FakeReader, write_state

if TYPE_CHECKING:
    from arbiter_testing.fake_cuda import FakeCuda
    from arbiter_testing.fake_servers import FakeDiffusionServer, FakeLlmServer, FakeModel, RecordingServer
    from arbiter_testing.model_server import ModelServer
    from arbiter_testing.users import ChildFailed, run_as
    from arbiter_testing.vram_board import GIB, VramBoard
    from arbiter_testing.waiting import wait_until

#: the helpers tests import, loaded on first use: a daemon loads this plugin for its two
#: kinds, and the fake servers would bring it an HTTP server and a websocket library
#: (megabytes of its memory) it never uses
_LAZY = {
    "FakeDiffusionServer": "fake_servers",
    "FakeLlmServer": "fake_servers",
    "FakeModel": "fake_servers",
    "RecordingServer": "fake_servers",
    "wait_until": "waiting",
    "ChildFailed": "users",
    "run_as": "users",
    "GIB": "vram_board",
    "VramBoard": "vram_board",
    "ModelServer": "model_server",
    "FakeCuda": "fake_cuda",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "GIB",
    "ChildFailed",
    "FakeCuda",
    "FakeDiffusionServer",
    "FakeLlmServer",
    "FakeModel",
    "FakeProfileTranslator",
    "FakeReader",
    "ModelServer",
    "RecordingServer",
    "VramBoard",
    "api_fixture",
    "arbiter_register_readers",
    "arbiter_register_translators",
    "run_as",
    "wait_until",
    "write_state",
]

API_FIXTURES = Path(__file__).parent / "api_fixtures"


def api_fixture(name: str) -> Path:
    """A real program's documented request or answer, e.g. ``llm-server-api/api-ps-response.json``
    (see ``api_fixtures/SOURCES.md``)."""
    path = API_FIXTURES / name
    if not path.is_file():
        raise FileNotFoundError(f"no API fixture {name!r} under {API_FIXTURES}")
    return path


@hookimpl
def arbiter_register_readers(register: Callable[[str, type], None]) -> None:
    register("fake", FakeReader)


@hookimpl
def arbiter_register_translators(register: Callable[[str, type], None]) -> None:
    register("fake_profile", FakeProfileTranslator)
