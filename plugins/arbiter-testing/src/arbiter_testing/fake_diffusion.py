"""A fake image-diffusion server (ComfyUI's API, following its ``server.py``: the routes, and
``execution.py``: ``PromptQueue``'s items): ``GET /queue`` (``queue_running``/``queue_pending``
lists of ``[number, prompt_id, prompt, extra_data, outputs_to_execute]``), ``POST /prompt``,
``POST /free`` (``unload_models``/``free_memory``, applied between prompts, as the real one
does), and a websocket at ``/ws`` (on its own port) sending ``status``, ``execution_start``,
``execution_cached``, ``executing``, ``progress`` and ``executed`` messages shaped like a real
run's.  A run goes at full speed while it has the VRAM it needs and at the starved speed while
it does not, so a test sees what a handoff saves.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from arbiter_testing.fake_http import HOST, WORKING_SHARE, FakeApp
from arbiter_testing.vram_board import GIB, VramBoard


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


class FakeDiffusionServer(FakeApp):
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
        # [number, prompt_id, prompt, extra_data, outputs_to_execute], as PromptQueue keeps them
        return [job.number, job.prompt_id, job.prompt, {"create_time": job.created_ms, "client_id": ""}, ["9"]]

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
