"""A fake local LLM server (Ollama 0.33's API, following ``server/routes.go``: the
``/api/ps`` and ``/api/generate`` handlers, and ``server/sched.go``: an unload waits for the
requests running on that model) holding models in (fake) VRAM: ``GET /api/ps``
lists the loaded models exactly as the documented answer does (``name``, ``model``, ``size``,
``digest``, ``details``, ``expires_at``, ``size_vram``); ``POST /api/generate`` loads a model,
runs a request, or with ``{"model": ..., "keep_alive": 0}`` and no prompt unloads it,
answering at once with ``"done_reason": "unload"`` and applying the unload only once no
request on that model is running (and after ``unload_s``).  Answers are single JSON objects
(as with ``"stream": false``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from arbiter_testing.fake_http import WORKING_SHARE, FakeApp, now_iso
from arbiter_testing.vram_board import VramBoard

RELEASE_HANG_S = 600.0


DEFAULT_DETAILS: Mapping[str, Any] = {
    "parent_model": "",
    "format": "gguf",
    "family": "llama",
    "families": ["llama"],
    "parameter_size": "7.2B",
    "quantization_level": "Q4_0",
}


@dataclass(frozen=True)
class FakeModel:
    """A model the fake LLM server can load: its name and the VRAM it takes."""

    name: str
    size_bytes: int
    details: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_DETAILS))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()


@dataclass
class _Loaded:
    model: FakeModel
    expires_at: datetime
    running: int = 0  # requests on it now
    unload_asked: bool = False
    unloading: bool = False
    loading: bool = False


@dataclass(frozen=True)
class Unload:
    """One unload the fake carried out: asked, started (once no request ran), done."""

    model: str
    asked_at: float
    started_at: float
    done_at: float

    @property
    def own_s(self) -> float:
        """The fake's own unload time (what a handoff benchmark subtracts)."""
        return self.done_at - self.started_at


class FakeLlmServer(FakeApp):
    """A local LLM server holding models in (fake) VRAM.

    :param board: where the VRAM of its process is written.
    :param models: the models it can load (by name).
    :param pid: the process whose VRAM it writes (this one by default).
    :param load_s: how long a load takes; :param unload_s: how long an unload takes once it starts.
    :param generate_s: how long a request with a prompt runs.
    """

    KEEP_ALIVE_S = 300.0  # the real server's default keep_alive (5 minutes)

    def __init__(
        self,
        board: VramBoard,
        models: list[FakeModel],
        pid: int | None = None,
        load_s: float = 0.0,
        unload_s: float = 0.0,
        generate_s: float = 0.05,
        port: int = 0,
    ) -> None:
        super().__init__(port)
        self.board = board
        self.catalog = {m.name: m for m in models}
        self.pid = os.getpid() if pid is None else pid
        self.load_s, self.unload_s, self.generate_s = load_s, unload_s, generate_s
        self._lock = threading.Condition()
        self._loaded: dict[str, _Loaded] = {}
        self._asked_at: dict[str, float] = {}
        self.unloads: list[Unload] = []
        self.loads: list[tuple[str, float]] = []  # (model, monotonic time it was loaded)
        #: "500": an unload request is answered HTTP 500 and unloads nothing; "hang": it is
        #: not answered (for RELEASE_HANG_S, or until the server stops)
        self.release_fault = ""
        self._hung = threading.Event()
        self.routes[("GET", "/api/ps")] = lambda body: (200, self.ps())
        self.routes[("POST", "/api/generate")] = self._generate_route
        self.routes[("GET", "/")] = lambda body: (200, b"fake LLM server is running")
        # not the real program's: what a test or benchmark in another process reads back
        self.routes[("GET", "/debug/unloads")] = lambda body: (
            200,
            [
                {
                    "model": u.model,
                    "asked_at": u.asked_at,
                    "started_at": u.started_at,
                    "done_at": u.done_at,
                    "own_s": u.own_s,
                }
                for u in list(self.unloads)
            ],
        )
        self._publish()

    # what it answers ------------------------------------------------------------------------

    def ps(self) -> dict[str, Any]:
        with self._lock:
            return {
                "models": [
                    {
                        "name": m.model.name,
                        "model": m.model.name,
                        "size": m.model.size_bytes,
                        "digest": m.model.digest,
                        "details": dict(m.model.details),
                        "expires_at": m.expires_at.isoformat(),
                        "size_vram": m.model.size_bytes,
                    }
                    for m in self._loaded.values()
                ]
            }

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._loaded)

    def held_bytes(self) -> int:
        with self._lock:
            return sum(m.model.size_bytes for m in self._loaded.values())

    def _publish(self) -> None:
        """Write the VRAM it holds (caller may hold the lock)."""
        held = sum(m.model.size_bytes for m in self._loaded.values())
        busy = any(m.running for m in self._loaded.values())
        self.board.set(self.pid, held, WORKING_SHARE if busy else 0.0)

    def _generate_route(self, body: dict[str, Any] | None) -> tuple[int, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
            return 400, {"error": "model is required"}
        name = body["model"]
        if name not in self.catalog:
            return 404, {"error": f"model '{name}' not found, try pulling it first"}
        keep_alive = body.get("keep_alive")
        prompt = body.get("prompt") or ""
        if _zero(keep_alive) and not prompt:
            if self.release_fault == "500":  # a server that breaks on unloading (a test's fault)
                return 500, {"error": "fake LLM server: unloading failed (release fault 500)"}
            if self.release_fault == "hang":
                self._hung.wait(RELEASE_HANG_S)
                return 503, {"error": "fake LLM server: hung on unloading"}
            # (the real server loads a model that is not loaded and then unloads it; here
            # there is nothing to do for one that is not loaded)
            self.unload(name)
            return 200, {"model": name, "created_at": now_iso(), "response": "", "done": True, "done_reason": "unload"}
        if not prompt:
            self.load(name)
            return 200, {"model": name, "created_at": now_iso(), "response": "", "done": True}
        self.generate(name, unload_after=_zero(keep_alive))
        return 200, {
            "model": name,
            "created_at": now_iso(),
            "response": "fake answer",
            "done": True,
            "done_reason": "stop",
        }

    # what it does ---------------------------------------------------------------------------

    def _acquire(self, name: str, running: bool) -> _Loaded:
        """Load ``name`` if it is not (blocking for ``load_s``); with ``running``, count a request
        on it from the start, so no unload can slip in between.  A pending unload is called
        off (a new request resets the real server's keep_alive)."""
        model = self.catalog[name]
        with self._lock:
            self._lock.wait_for(lambda: not (name in self._loaded and self._loaded[name].unloading), timeout=60)
            entry = self._loaded.get(name)
            fresh = entry is None
            if entry is None:
                entry = self._loaded[name] = _Loaded(model, datetime.now(UTC).astimezone(), loading=True)
            entry.unload_asked = False
            self._asked_at.pop(name, None)
            entry.expires_at = datetime.now(UTC).astimezone() + timedelta(seconds=self.KEEP_ALIVE_S)
            entry.running += 1 if running else 0
            self._publish()  # the weights are allocated as the load starts
            self._lock.notify_all()
        if fresh:
            if self.load_s:
                time.sleep(self.load_s)  # simulated load time
            with self._lock:
                entry.loading = False
                self.loads.append((name, time.monotonic()))
                self._lock.notify_all()
        else:
            with self._lock:
                self._lock.wait_for(lambda: not entry.loading, timeout=60)
        return entry

    def load(self, name: str) -> None:
        """Load ``name`` (a request with no prompt), blocking until it is loaded."""
        self._acquire(name, running=False)
        self._maybe_unload(name)  # an unload asked while it loaded

    def generate(self, name: str, seconds: float | None = None, unload_after: bool = False) -> None:
        """Run one request on ``name`` (loading it first), blocking for its length."""
        entry = self._acquire(name, running=True)
        time.sleep(self.generate_s if seconds is None else seconds)  # simulated generation
        with self._lock:
            entry.running -= 1
            if unload_after:
                self._ask_unload(entry)
            self._publish()
            self._lock.notify_all()
        self._maybe_unload(name)

    def start_request(self, name: str, seconds: float, unload_after: bool = False) -> threading.Thread:
        """A request on its own thread (a client generating), returned once it runs."""
        thread = threading.Thread(
            target=self.generate, args=(name, seconds, unload_after), daemon=True, name=f"fake-llm-request:{name}"
        )
        thread.start()
        with self._lock:
            self._lock.wait_for(
                lambda: (
                    (name in self._loaded and self._loaded[name].running > 0 and not self._loaded[name].loading)
                    or not thread.is_alive()
                ),
                timeout=60,
            )
        return thread

    def running(self, name: str) -> int:
        with self._lock:
            entry = self._loaded.get(name)
            return entry.running if entry else 0

    def _ask_unload(self, entry: _Loaded) -> None:
        entry.unload_asked = True
        entry.expires_at = datetime.now(UTC).astimezone()
        self._asked_at.setdefault(entry.model.name, time.monotonic())

    def unload(self, name: str) -> None:
        """Ask for ``name`` to be unloaded: done at once when no request runs on it, else when
        the last one finishes.  Returns without waiting (as the real answer does)."""
        with self._lock:
            entry = self._loaded.get(name)
            if entry is None:
                return
            self._ask_unload(entry)
        threading.Thread(target=self._maybe_unload, args=(name,), daemon=True, name=f"fake-llm-unload:{name}").start()

    def _maybe_unload(self, name: str) -> None:
        with self._lock:
            entry = self._loaded.get(name)
            if entry is None or not entry.unload_asked or entry.running or entry.unloading or entry.loading:
                return
            entry.unloading = True
            started = time.monotonic()
        if self.unload_s:
            time.sleep(self.unload_s)  # simulated unload time
        with self._lock:
            self._loaded.pop(name, None)
            asked = self._asked_at.pop(name, started)
            # recorded before it shows on the board: a test that saw the VRAM fall finds the record
            self.unloads.append(Unload(name, asked, started, time.monotonic()))
            self._publish()
            self._lock.notify_all()

    def stop(self) -> None:
        self._hung.set()  # a request hung on purpose must not hold the shutdown up
        super().stop()
        self.board.remove(self.pid)


def _zero(keep_alive: Any) -> bool:
    """keep_alive 0 in any of the forms the real server takes (a number or a duration)."""
    if isinstance(keep_alive, bool):
        return False
    if isinstance(keep_alive, (int, float)):
        return keep_alive == 0
    if isinstance(keep_alive, str):
        return keep_alive.strip() in ("0", "0s", "0m", "0h")
    return False
