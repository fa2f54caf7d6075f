"""Fake servers that load models on demand and unload them when asked, shaped like the real
ones' documented APIs:

- :class:`FakeLlamaSwap`, llama-swap (a proxy that starts one upstream server per model, port
  8080), following its source (``proxy/proxymanager.go``: the routes, ``apiKeys`` asking
  every route but ``/health`` for ``Authorization: Bearer KEY``; ``proxy/process.go``: a
  process is stopped, starting, ready, stopping or shut down): ``GET /health`` answers ``OK``;
  ``GET /v1/models`` lists the configured models; ``POST /v1/chat/completions``
  ``{"model", "messages"}`` swaps to that model (the one loaded before is stopped, then the
  new one starts over ``load_s``) and answers; an unknown model is answered 400.
  ``GET /running`` is ``{"running": [{"model": ID, "state": STATE}]}``, listing every process
  that is not stopped: ``starting`` while it loads, then ``ready``.  ``GET /unload`` and
  ``POST /api/models/unload`` stop every model at once (``StopImmediately``: a request in
  flight is not waited for, and its proxy answers 502) and answer ``OK``.
- :class:`FakeLocalAI`, LocalAI 4.9 (port 8080), following its source
  (``core/http/routes/localai.go`` and ``core/http/endpoints/localai/backend_monitor.go``: the
  routes; ``core/services/backend_monitor.go``: shutdown and the monitor's state;
  ``pkg/model/loader.go``: a busy backend is given 30 s to finish before a shutdown gives up):
  ``GET /readyz`` and ``GET /healthz``; ``POST /v1/chat/completions`` ``{"model", "messages"}``
  loads that model's backend if it is not loaded, then answers; an unknown model is answered
  404.  ``GET /system`` is ``{"backends": [...], "loaded_models": [{"id": ID}]}``.
  ``GET /backend/monitor?model=ID`` is ``{"state": 2, "memory": {...}}`` for a loaded model,
  500 for one that is not: the llama-cpp backend (a C++ gRPC server) reports no busy state,
  so it never reads 1.  ``POST /backend/shutdown`` ``{"model": ID}`` stops that model's
  backend (200); while a request runs on it, it waits ``busy_grace_s`` (30 s) for it to end,
  then answers 500 and the backend stays loaded.  Several models may stay loaded at once.

Neither says how many requests are running in the list of loaded models: a loaded model holds
its VRAM whether or not it answers one.  Their VRAM goes to a :class:`VramBoard` for the
``fake`` reader.  Run one as a process:
``python -m arbiter_testing.fake_model_swappers llama-swap|localai --state-file F --ready-file R``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

from arbiter_testing.fake_http import WORKING_SHARE, FakeApp
from arbiter_testing.fake_process import board_of, fake_parser, serve_until_stopped
from arbiter_testing.vram_board import GIB, VramBoard

#: the models each fake serves, with the VRAM each takes once loaded
MODELS: dict[str, int] = {"qwen2.5-7b": 6 * GIB, "llama-3.2-3b": 3 * GIB}


class _Swapper(FakeApp):
    """What both share: models loaded on a request and unloaded when asked, each request
    running ``gen_s``; only one model at a time when ``swap`` is true."""

    swap = True

    def __init__(
        self,
        board: VramBoard,
        models: dict[str, int] | None = None,
        gen_s: float = 0.5,
        load_s: float = 0.1,
        pid: int | None = None,
        port: int = 0,
    ) -> None:
        super().__init__(port)
        self.board = board
        self.models = dict(MODELS if models is None else models)
        self.gen_s, self.load_s = gen_s, load_s
        self.pid = os.getpid() if pid is None else pid
        self._lock = threading.Lock()
        self.loaded: dict[str, int] = {}  # model -> requests running on it
        self.starting: set[str] = set()  # models whose process starts
        self.unloads = 0
        self._publish()

    def _publish(self) -> None:
        with self._lock:
            held = sum(self.models[m] for m in self.loaded)
            share = WORKING_SHARE if any(self.loaded.values()) else 0.0
        self.board.set(self.pid, held, share)

    def _load(self, model: str) -> None:
        with self._lock:
            if model in self.loaded:
                self.loaded[model] += 1
                return
            if self.swap:
                self.loaded.clear()
            self.starting.add(model)
        self._publish()
        time.sleep(self.load_s)  # the upstream server starts and reads its weights
        with self._lock:
            self.starting.discard(model)
            self.loaded[model] = self.loaded.get(model, 0) + 1
        self._publish()

    def _generate(self, model: str) -> bool:
        """One request on ``model``; whether it ran to its end (an unload stopped it meanwhile)."""
        self._load(model)
        self._publish()  # working now, on a model that was loaded already or not
        with self._lock:
            generation = self.unloads
        try:
            time.sleep(self.gen_s)
        finally:
            with self._lock:
                if model in self.loaded:  # an unload while it ran ended it
                    self.loaded[model] -= 1
                cut = self.unloads != generation and model not in self.loaded
            self._publish()
        return not cut

    def _unload(self, models: list[str] | None = None) -> None:
        with self._lock:
            for name in list(self.loaded) if models is None else models:
                self.loaded.pop(name, None)
            self.unloads += 1
        self._publish()

    def _chat(self, body: Any) -> tuple[int, Any] | str:
        """The requested model's name, or the error answer where there is none."""
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            return 400, {"error": "the request names no model"}
        return model

    @staticmethod
    def _completion(model: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def stop(self) -> None:
        super().stop()
        self.board.remove(self.pid)


class FakeLlamaSwap(_Swapper):
    def __init__(self, board: VramBoard, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.routes[("GET", "/health")] = lambda body: (200, b"OK")
        self.routes[("GET", "/v1/models")] = lambda body: (200, self._list())
        self.routes[("GET", "/running")] = lambda body: (200, self._running())
        self.routes[("GET", "/unload")] = self._unload_all
        self.routes[("POST", "/api/models/unload")] = self._unload_all
        self.routes[("POST", "/v1/chat/completions")] = self._chat_route

    def _list(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "created": 0, "owned_by": "llama-swap"} for m in self.models],
        }

    def _running(self) -> dict[str, Any]:
        with self._lock:
            starting = [{"model": m, "state": "starting"} for m in sorted(self.starting)]
            return {"running": [{"model": m, "state": "ready"} for m in self.loaded] + starting}

    def _unload_all(self, body: Any) -> tuple[int, Any]:
        self._unload()
        return 200, b"OK"

    def _chat_route(self, body: Any) -> tuple[int, Any]:
        model = self._chat(body)
        if not isinstance(model, str):
            return model
        if model not in self.models:
            return 400, {"error": f"could not find suitable handler for {model}"}
        if not self._generate(model):  # its upstream was stopped under it: the proxy's error
            return 502, b"Bad Gateway"
        return 200, self._completion(model)


class FakeLocalAI(_Swapper):
    swap = False  # each model runs in its own backend process, side by side
    BACKENDS = ("llama-cpp", "whisper", "diffusers")

    def __init__(self, board: VramBoard, busy_grace_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.busy_grace_s = busy_grace_s
        self.open_paths = frozenset({"/readyz", "/healthz"})
        self.routes[("GET", "/readyz")] = lambda body: (200, b"OK")
        self.routes[("GET", "/healthz")] = lambda body: (200, b"OK")
        self.routes[("GET", "/system")] = lambda body: (200, self._system())
        self.routes[("GET", "/backend/monitor")] = self._monitor
        self.routes[("POST", "/backend/shutdown")] = self._shutdown
        self.routes[("POST", "/v1/chat/completions")] = self._chat_route

    def _system(self) -> dict[str, Any]:
        with self._lock:
            return {"backends": list(self.BACKENDS), "loaded_models": [{"id": m} for m in self.loaded]}

    def _monitor(self, body: Any) -> tuple[int, Any]:
        model = self._query("GET", "/backend/monitor").get("model", [None])[0]
        if model is None and isinstance(body, dict):
            model = body.get("model")  # the older form: the name in a JSON body
        if not model:
            return 400, {"error": {"code": 400, "message": "model is required", "type": ""}}
        with self._lock:
            running = self.loaded.get(model)
        if running is None:
            return 500, {"error": {"code": 500, "message": f"backend {model} is not loaded", "type": ""}}
        total = self.models[model]
        breakdown = {"weights": total * 3 // 4, "kv_cache": total - total * 3 // 4}
        # the llama-cpp backend has no Status of its own: ready, whether or not it answers one
        return 200, {"state": 2, "memory": {"total": total, "breakdown": breakdown}}

    def _shutdown(self, body: Any) -> tuple[int, Any]:
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            return 400, {"error": {"code": 400, "message": "model is required", "type": ""}}
        deadline = time.monotonic() + self.busy_grace_s
        while True:
            with self._lock:
                busy = self.loaded.get(model, 0) > 0
            if not busy:
                break
            if time.monotonic() >= deadline:  # the backend is left as it is
                message = f"failed to shutdown model {model}: backend still busy after {self.busy_grace_s:g}s"
                return 500, {"error": {"code": 500, "message": message, "type": ""}}
            time.sleep(0.01)
        self._unload([model])
        return 200, None

    def _query(self, method: str, path: str) -> dict[str, list[str]]:
        """The query of the latest request to ``path`` (routes are given the body only)."""
        for seen in reversed(self.requests(method)):
            split = urlsplit(seen.path)
            if split.path == path:
                return parse_qs(split.query)
        return {}

    def _chat_route(self, body: Any) -> tuple[int, Any]:
        model = self._chat(body)
        if not isinstance(model, str):
            return model
        if model not in self.models:
            return 404, {"error": {"code": 404, "message": f"model {model} not found", "type": ""}}
        self._generate(model)
        return 200, self._completion(model)


SERVERS: dict[str, type[_Swapper]] = {"llama-swap": FakeLlamaSwap, "localai": FakeLocalAI}


def main(argv: list[str] | None = None) -> int:
    parser = fake_parser("arbiter_testing.fake_model_swappers")
    parser.add_argument("program", choices=sorted(SERVERS))
    parser.add_argument("--gen-s", type=float, default=0.5)
    parser.add_argument("--load-s", type=float, default=0.1)
    parser.add_argument("--api-key", default="", help="its API key: its routes ask for it")
    parser.add_argument("--busy-grace-s", type=float, default=30.0, help="localai: how long a busy shutdown waits")
    args = parser.parse_args(argv)
    board = board_of(args)
    more = {"busy_grace_s": args.busy_grace_s} if args.program == "localai" else {}
    fake = SERVERS[args.program](board, gen_s=args.gen_s, load_s=args.load_s, **more)
    fake.api_key = args.api_key
    return serve_until_stopped(fake, args.ready_file)


if __name__ == "__main__":
    raise SystemExit(main())
