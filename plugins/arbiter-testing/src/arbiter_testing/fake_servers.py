"""Fake programs that hold VRAM, serving on 127.0.0.1 the subsets of their real APIs arbiter uses.

- :class:`FakeLlmServer`, a local LLM server (Ollama's API): ``GET /api/ps`` lists the loaded
  models exactly as the documented answer does (``name``, ``model``, ``size``, ``digest``,
  ``details``, ``expires_at``, ``size_vram``); ``POST /api/generate`` loads a model, runs a
  request, or with ``{"model": ..., "keep_alive": 0}`` and no prompt unloads it, answering at
  once with ``"done_reason": "unload"`` and applying the unload only once no request on that
  model is running (and after ``unload_s``).  Answers are single JSON objects (as with
  ``"stream": false``).
- :class:`FakeDiffusionServer`, an image-diffusion server (ComfyUI's API): ``GET /queue``
  (``queue_running``/``queue_pending`` lists of ``[number, prompt_id, prompt, outputs,
  metadata]``), ``POST /prompt``, ``POST /free`` (``unload_models``/``free_memory``, applied
  between prompts, as the real one does), and a websocket at ``/ws`` (on its own port) sending
  ``status``, ``execution_start``, ``execution_cached``, ``executing``, ``progress`` and
  ``executed`` messages shaped like a real run's.  A run goes at full speed while it has the
  VRAM it needs and at the starved speed while it does not, so a test sees what a handoff
  saves.
- :class:`RecordingServer`: answers every request with a scripted status and records it.

Every fake writes the VRAM its process holds to a :class:`~arbiter_testing.vram_board.VramBoard`
(the ``fake`` reader's state file).  Run one as its own process (so a daemon can match it by
its command line) with ``python -m arbiter_testing.fake_servers llm|diffusion ...``.

It runs past 500 lines because both fakes share its HTTP serving, the VRAM board and the
process entry point; the servers added since are modules of their own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from arbiter_testing.fake_reader import write_state
from arbiter_testing.vram_board import GIB, VramBoard

HOST = "127.0.0.1"
#: the share of GPU time a fake reports while it works (the fake reader integrates it)
WORKING_SHARE = 0.9
RELEASE_HANG_S = 600.0


def _now_iso() -> str:
    return datetime.now(UTC).astimezone().isoformat()


# --- a small JSON HTTP server -------------------------------------------------------------------


Route = Callable[[dict[str, Any] | None], tuple[int, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: _JsonHttpServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's next request reuses the connection

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read what they need from the fake itself, not from stderr

    def _serve(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                self._reply(400, {"error": "invalid JSON body"})
                return
        self.server.app.record(method, self.path, dict(self.headers), body)
        route = self.server.app.routes.get((method, path))
        if route is None:
            route = self.server.app.routes.get((method, "*"))
        if route is None:
            self._reply(404, {"error": f"no route {method} {path}"})
            return
        status, answer = route(body)
        self._reply(status, answer)

    def _reply(self, status: int, answer: Any) -> None:
        if isinstance(answer, bytes):
            data, ctype = answer, "text/plain; charset=utf-8"
        elif answer is None:
            data, ctype = b"", "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(answer).encode(), "application/json; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")


class _JsonHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: _App, port: int = 0) -> None:
        self.app = app
        super().__init__((HOST, port), _Handler)


@dataclass(frozen=True)
class Seen:
    """One request a fake received."""

    at: float  # monotonic
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


class _App:
    """What every fake shares: its HTTP server on its own thread and a record of requests."""

    def __init__(self, port: int = 0) -> None:
        self.routes: dict[tuple[str, str], Route] = {}
        self.seen: list[Seen] = []
        self._seen_lock = threading.Lock()
        self._http = _JsonHttpServer(self, port)
        # a short poll: stopping a fake (shutdown waits for it) stays quick
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, name=f"fake-http:{self.port}", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def record(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        with self._seen_lock:
            self.seen.append(Seen(time.monotonic(), method, path, headers, body))

    def requests(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        with self._seen_lock:
            return [s for s in self.seen if (method is None or s.method == method) and (path is None or s.path == path)]

    def start(self) -> _App:
        self._http_thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._http_thread.join(timeout=5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RecordingServer(_App):
    """Answers every request with ``status`` and ``answer`` (after ``delay_s``), recording each."""

    def __init__(self, status: int = 200, answer: Any = None, delay_s: float = 0.0, port: int = 0) -> None:
        super().__init__(port)
        self.status = status
        self.answer = answer
        self.delay_s = delay_s
        for method in ("GET", "POST", "PUT", "PATCH"):
            self.routes[(method, "*")] = self._any

    def _any(self, body: dict[str, Any] | None) -> tuple[int, Any]:
        if self.delay_s:
            time.sleep(self.delay_s)  # a slow program, for timeout tests
        return self.status, self.answer


# --- the LLM server -----------------------------------------------------------------------------


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


class FakeLlmServer(_App):
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
            return 200, {"model": name, "created_at": _now_iso(), "response": "", "done": True, "done_reason": "unload"}
        if not prompt:
            self.load(name)
            return 200, {"model": name, "created_at": _now_iso(), "response": "", "done": True}
        self.generate(name, unload_after=_zero(keep_alive))
        return 200, {
            "model": name,
            "created_at": _now_iso(),
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


# --- the diffusion server -----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One prompt the fake diffusion server ran."""

    prompt_id: str
    started_at: float
    done_at: float
    starved_s: float  # how long of it ran without the VRAM it needed

    @property
    def took_s(self) -> float:
        return self.done_at - self.started_at


@dataclass
class _Job:
    number: int
    prompt_id: str
    prompt: Any
    created_ms: int


class FakeDiffusionServer(_App):
    """An image-diffusion server with a queue, ``/free`` and a websocket of status messages.

    :param board: where the VRAM of its process is written (and where it reads free VRAM).
    :param model_bytes: what it keeps loaded after a run (until ``/free`` unloads it).
    :param needs_bytes: what a run needs; with less it runs at the starved speed.
    :param fast_s: a run's length with what it needs; :param starved_s: its length without.
    :param steps: sampler steps (one ``progress`` message each).
    :param unload_s: how long an unload takes.
    :param ws_port: the websocket's port (0: any free one).
    """

    STEP_S = 0.01  # how often a run looks at the free VRAM and moves on

    def __init__(
        self,
        board: VramBoard,
        model_bytes: int = 6 * GIB,
        needs_bytes: int = 12 * GIB,
        fast_s: float = 0.3,
        starved_s: float = 3.0,
        steps: int = 30,
        unload_s: float = 0.0,
        pid: int | None = None,
        port: int = 0,
        ws_port: int = 0,
        loaded: bool = False,
    ) -> None:
        super().__init__(port)
        self.board = board
        self.pid = os.getpid() if pid is None else pid
        self.model_bytes, self.needs_bytes = model_bytes, needs_bytes
        self.fast_s, self.starved_s, self.steps, self.unload_s = fast_s, starved_s, steps, unload_s
        self._lock = threading.Condition()
        self._pending: list[_Job] = []
        self._running: _Job | None = None
        self._number = 0
        self._free_asked: dict[str, bool] | None = None
        self._held = model_bytes if loaded else 0
        self._published: tuple[int, bool] | None = None
        self._stopping = False
        self.runs: list[Run] = []
        self.frees: list[tuple[float, float]] = []  # (asked, done) of each /free carried out
        self._free_asked_at = 0.0
        self._clients: set[ServerConnection] = set()
        self._clients_lock = threading.Lock()
        self.routes[("GET", "/queue")] = lambda body: (200, self.queue())
        self.routes[("POST", "/prompt")] = self._prompt_route
        self.routes[("POST", "/free")] = self._free_route
        # not the real program's: what a test or benchmark in another process reads back
        self.routes[("GET", "/debug/runs")] = lambda body: (
            200,
            [
                {"prompt_id": r.prompt_id, "took_s": r.took_s, "starved_s": r.starved_s, "started_at": r.started_at}
                for r in list(self.runs)
            ],
        )
        self._ws: Server = serve(self._ws_session, HOST, ws_port, compression=None)
        self._ws_thread = threading.Thread(target=self._ws.serve_forever, name="fake-diffusion-ws", daemon=True)
        self._worker = threading.Thread(target=self._work, name="fake-diffusion-worker", daemon=True)
        with self._lock:
            self._publish(False)

    @property
    def ws_port(self) -> int:
        return int(self._ws.socket.getsockname()[1])

    @property
    def ws_url(self) -> str:
        return f"ws://{HOST}:{self.ws_port}/ws"

    def start(self) -> FakeDiffusionServer:
        super().start()
        self._ws_thread.start()
        self._worker.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._ws.shutdown()
        self._ws_thread.join(timeout=5)
        self._worker.join(timeout=10)
        super().stop()
        self.board.remove(self.pid)

    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def _publish(self, working: bool) -> None:
        """Write what it holds, when that changed (caller holds the lock)."""
        now = (self._held, working)
        if now != self._published:
            self.board.set(self.pid, self._held, WORKING_SHARE if working else 0.0)
            self._published = now

    # what it answers ------------------------------------------------------------------------

    def _item(self, job: _Job) -> list[Any]:
        # [job_number, prompt_id, workflow_json, output_node_ids, metadata]
        return [job.number, job.prompt_id, job.prompt, ["9"], {"create_time": job.created_ms}]

    def queue(self) -> dict[str, Any]:
        with self._lock:
            return {
                "queue_running": [self._item(self._running)] if self._running else [],
                "queue_pending": [self._item(j) for j in self._pending],
            }

    def _remaining(self) -> int:
        return len(self._pending) + (1 if self._running else 0)

    def _prompt_route(self, body: dict[str, Any] | None) -> tuple[int, Any]:
        if not isinstance(body, dict) or not body.get("prompt"):
            return 400, {
                "error": {
                    "type": "no_prompt",
                    "message": "No prompt provided",
                    "details": "No prompt provided",
                    "extra_info": {},
                },
                "node_errors": {},
            }
        prompt_id, number = self._enqueue(body["prompt"])
        return 200, {"prompt_id": prompt_id, "number": number, "node_errors": {}}

    def _free_route(self, body: dict[str, Any] | None) -> tuple[int, Any]:
        flags = body if isinstance(body, dict) else {}
        self.free(bool(flags.get("unload_models", False)), bool(flags.get("free_memory", False)))
        return 200, None  # the real server answers an empty 200

    # what it does ---------------------------------------------------------------------------

    def submit(self, prompt: Any = None) -> str:
        """Queue a prompt; returns its id."""
        return self._enqueue(prompt)[0]

    def _enqueue(self, prompt: Any) -> tuple[str, int]:
        prompt_id = str(uuid.uuid4())
        with self._lock:
            self._number += 1
            number = self._number
            self._pending.append(
                _Job(number, prompt_id, prompt or {"3": {"class_type": "KSampler"}}, int(time.time() * 1000))
            )
            remaining = self._remaining()
            self._lock.notify_all()
        self._broadcast(self._status(remaining))
        return prompt_id, number

    def free(self, unload_models: bool, free_memory: bool) -> None:
        """Ask for memory back: carried out between prompts (at once while idle)."""
        with self._lock:
            if not (unload_models or free_memory):
                return  # both default to false: nothing asked
            asked = self._free_asked or {"unload_models": False, "free_memory": False}
            asked["unload_models"] |= unload_models
            asked["free_memory"] |= free_memory
            self._free_asked = asked
            self._free_asked_at = self._free_asked_at or time.monotonic()
            self._lock.notify_all()

    def _apply_free(self) -> None:
        with self._lock:
            asked, self._free_asked = self._free_asked, None
            asked_at, self._free_asked_at = self._free_asked_at, 0.0
        if not asked:
            return
        if self.unload_s:
            time.sleep(self.unload_s)  # simulated unload time
        with self._lock:
            if asked["unload_models"]:
                self._held = 0
            self.frees.append((asked_at, time.monotonic()))  # recorded before it shows on the board
            self._publish(False)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._stopping or self._pending or self._free_asked)
                if self._stopping:
                    return
                job = self._pending.pop(0) if self._pending else None
                self._running = job
            if job is None:
                self._apply_free()
                continue
            self._run(job)
            with self._lock:
                self._running = None
                remaining = self._remaining()
            self._broadcast(self._status(remaining))
            self._apply_free()  # between prompts, as the real server frees memory

    def _run(self, job: _Job) -> None:
        pid = job.prompt_id
        self._broadcast(self._status(self._remaining_locked()))
        self._broadcast({"type": "execution_start", "data": {"prompt_id": pid}})
        self._broadcast({"type": "execution_cached", "data": {"nodes": [], "prompt_id": pid}})
        self._broadcast({"type": "executing", "data": {"node": "4", "prompt_id": pid}})
        started = time.monotonic()
        done = 0.0
        starved = 0.0
        step = 0
        last = started
        while done < 1.0:
            with self._lock:
                if self._stopping:
                    return
                # what it can have: what it holds plus what is free on the device
                avail = self._held + self.board.free_bytes()
                enough = avail >= self.needs_bytes
                self._held = self.needs_bytes if enough else max(self._held, min(avail, self.needs_bytes))
                self._publish(True)
            time.sleep(self.STEP_S)
            now = time.monotonic()
            span = now - last
            last = now
            done += span / (self.fast_s if enough else self.starved_s)
            if not enough:
                starved += span
            if int(done * self.steps) > step and step < self.steps:
                step = min(self.steps, int(done * self.steps))
                self._broadcast(
                    {"type": "progress", "data": {"value": step, "max": self.steps, "prompt_id": pid, "node": "3"}}
                )
        finished = time.monotonic()
        with self._lock:
            self._held = self.model_bytes  # the working memory goes; the model stays loaded
            self.runs.append(Run(pid, started, finished, starved))  # recorded before it shows on the board
            self._publish(False)
        self._broadcast(
            {
                "type": "executed",
                "data": {
                    "node": "9",
                    "output": {
                        "images": [
                            {"filename": f"ComfyUI_{len(self.runs):05d}_.png", "subfolder": "", "type": "output"}
                        ]
                    },
                    "prompt_id": pid,
                },
            }
        )
        self._broadcast({"type": "executing", "data": {"node": None, "prompt_id": pid}})

    def _remaining_locked(self) -> int:
        with self._lock:
            return self._remaining()

    # the websocket ------------------------------------------------------------------------------

    @staticmethod
    def _status(remaining: int, sid: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": remaining}}}
        if sid is not None:
            data["sid"] = sid
        return {"type": "status", "data": data}

    def _ws_session(self, conn: ServerConnection) -> None:
        if conn.request is None or conn.request.path.split("?", 1)[0] != "/ws":
            conn.close(1008, "only /ws is served")
            return
        with self._clients_lock:
            self._clients.add(conn)
        try:
            conn.send(json.dumps(self._status(self._remaining_locked(), sid=uuid.uuid4().hex)))
            for _ in conn:
                pass  # a client's messages are not read by the real server either
        except ConnectionClosed:
            pass
        finally:
            with self._clients_lock:
                self._clients.discard(conn)

    def ws_clients(self) -> int:
        with self._clients_lock:
            return len(self._clients)

    def drop_websockets(self) -> None:
        """Close every websocket connection (a restart, as clients see it)."""
        with self._clients_lock:
            clients = list(self._clients)
        for conn in clients:
            conn.close(1001, "going away")

    def _broadcast(self, message: dict[str, Any]) -> None:
        text = json.dumps(message)
        with self._clients_lock:
            clients = list(self._clients)
        for conn in clients:
            try:
                conn.send(text)
            except ConnectionClosed:
                pass  # it went; its session ends on its own


# --- as a process ------------------------------------------------------------------------------


def _model(spec: str) -> FakeModel:
    name, sep, gb = spec.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--model takes NAME=GB, not {spec!r}")
    return FakeModel(name, int(float(gb) * GIB))


def main(argv: list[str] | None = None) -> int:
    """Run one fake as this process until SIGTERM; its ports go into ``--ready-file``."""
    parser = argparse.ArgumentParser(prog="python -m arbiter_testing.fake_servers")
    parser.add_argument("program", choices=["llm", "diffusion"])
    parser.add_argument("--state-file", required=True, help="the fake reader's state file")
    parser.add_argument("--ready-file", required=True, help="written with {pid, url, ws_url} once serving")
    parser.add_argument("--total-gb", type=float, default=24.0)
    parser.add_argument("--model", type=_model, action="append", default=[], help="llm: NAME=GB it can load")
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--unload-s", type=float, default=0.0)
    parser.add_argument("--model-gb", type=float, default=6.0, help="diffusion: what it keeps loaded")
    parser.add_argument("--needs-gb", type=float, default=12.0, help="diffusion: what a run needs")
    parser.add_argument("--fast-s", type=float, default=0.3)
    parser.add_argument("--starved-s", type=float, default=3.0)
    parser.add_argument(
        "--release-fault",
        choices=["", "500", "hang"],
        default="",
        help="llm: answer unload requests with HTTP 500, or never",
    )
    args = parser.parse_args(argv)
    board = VramBoard(args.state_file, int(args.total_gb * GIB))
    fake: _App
    if args.program == "llm":
        llm = FakeLlmServer(
            board, args.model or [FakeModel("mistral:latest", 13 * GIB)], load_s=args.load_s, unload_s=args.unload_s
        )
        llm.release_fault = args.release_fault
        fake = llm
    else:
        fake = FakeDiffusionServer(
            board,
            int(args.model_gb * GIB),
            int(args.needs_gb * GIB),
            args.fast_s,
            args.starved_s,
            unload_s=args.unload_s,
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    fake.start()
    try:
        ready = {"pid": os.getpid(), "url": fake.url}
        if isinstance(fake, FakeDiffusionServer):
            ready["ws_url"] = fake.ws_url
        write_state(args.ready_file, ready)
        stop.wait()
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
