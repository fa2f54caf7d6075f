"""A fake vLLM OpenAI-compatible server with sleep mode.

Follows vLLM's source at the version the shipped rule was checked against (0.33; the sleep
``mode`` has been there since 0.17): ``vllm/entrypoints/serve/sleep/api_router.py`` (the
``/sleep``, ``/wake_up`` and ``/is_sleeping`` routes, served with ``VLLM_SERVER_DEV_MODE=1``),
``vllm/engine/protocol.py`` and ``vllm/v1/engine/async_llm.py`` (``sleep(level, mode)``, whose
``mode`` defaults to ``abort``), ``vllm/v1/metrics/loggers.py`` (the gauges) and
``vllm/entrypoints/openai/api_server.py`` (``--api-key``: every ``/v1`` route answers 401
without ``Authorization: Bearer KEY``).

- ``GET /health``: 200 while it serves.
- ``GET /v1/models``: ``{"object": "list", "data": [{"id": MODEL, "object": "model", ...}]}``.
- ``GET /metrics``: the Prometheus text format, with the gauges ``vllm:num_requests_running``
  and ``vllm:num_requests_waiting`` labelled ``model_name`` (and a counter beside them).
- ``POST /v1/completions`` ``{"model", "prompt", "max_tokens"}``: runs for ``gen_s`` (the
  running gauge counts it), then answers a ``text_completion``.  One that arrives while it
  sleeps (or drains for a sleep) waits, counted as waiting, until it is woken.
- ``POST /sleep?level=1&mode=M``: level 1 offloads the weights to CPU memory and discards the
  KV cache, so the VRAM falls to what the CUDA context keeps; answered 200 once done.
  ``mode=abort`` (the default) aborts the requests in flight at once: each is answered with
  an error (counted in ``aborted``).  ``mode=wait`` lets them finish first, holding new ones.
  ``POST /wake_up``: the weights and cache come back over ``wake_s``, then 200.
  ``GET /is_sleeping``: ``{"is_sleeping": bool}``.

Like the real server it preallocates its KV cache: it holds the same VRAM idle or busy, so
VRAM cannot say whether it works.  Its VRAM goes to a :class:`VramBoard` for the ``fake``
reader.  Run as a process: ``python -m arbiter_testing.fake_vllm --state-file F --ready-file R``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

from arbiter_testing.fake_preallocated import PreallocatedServer
from arbiter_testing.fake_process import board_of, fake_parser, serve_until_stopped
from arbiter_testing.vram_board import GIB, VramBoard


class FakeVllmServer(PreallocatedServer):
    """One model, its weights and KV cache preallocated in ``held_bytes``."""

    def __init__(
        self,
        board: VramBoard,
        model: str = "Qwen/Qwen2.5-7B-Instruct",
        held_bytes: int = 13 * GIB,
        gen_s: float = 0.5,
        wake_s: float = 0.2,
        pid: int | None = None,
        port: int = 0,
    ) -> None:
        super().__init__(board, held_bytes, gen_s, pid, port)
        self.model, self.wake_s = model, wake_s
        self.sleeping = False
        self.draining = False  # a /sleep?mode=wait lets the requests in flight finish
        self.waiting = 0  # requests held until it wakes
        self.aborted = 0  # requests in flight a /sleep aborted
        self._epoch = 0  # a sleep that aborts moves it: a request started before it is aborted
        self._changed = threading.Condition(self._lock)
        # with --api-key only the OpenAI routes (/v1) ask for it
        self.open_paths = frozenset({"/health", "/metrics", "/sleep", "/wake_up", "/is_sleeping"})
        self.level = 0
        self.wakes = 0
        self.sleeps = 0
        #: "500": /wake_up fails with HTTP 500 and it stays asleep (a test's fault)
        self.wake_fault = ""
        self.routes[("GET", "/health")] = lambda body: (200, None)
        self.routes[("GET", "/v1/models")] = lambda body: (200, self.models())
        self.routes[("GET", "/metrics")] = lambda body: (200, self.metrics().encode())
        self.routes[("GET", "/is_sleeping")] = lambda body: (200, {"is_sleeping": self.is_sleeping()})
        self.routes[("POST", "/sleep")] = self._sleep_route
        self.routes[("POST", "/wake_up")] = self._wake_route
        self.routes[("POST", "/v1/completions")] = self._completion_route
        # not the real program's: a test in another process sets or clears the wake-up fault
        self.routes[("POST", "/debug/wake_fault")] = self._fault_route
        self._publish()

    def is_sleeping(self) -> bool:
        with self._lock:
            return self.sleeping

    def given_up(self) -> bool:
        return self.sleeping

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "vllm", "root": self.model}],
        }

    def metrics(self) -> str:
        with self._lock:
            running, waiting = self.running, self.waiting
        label = f'{{engine="0",model_name="{self.model}"}}'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} {float(waiting)}\n"
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{label} {float(self.sleeps + self.wakes)}\n"
        )

    def _query(self, path: str) -> dict[str, list[str]]:
        """The query of the latest request to ``path`` (routes are given the body only)."""
        for seen in reversed(self.requests("POST")):
            split = urlsplit(seen.path)
            if split.path == path:
                return parse_qs(split.query)
        return {}

    def _sleep_route(self, body: Any) -> tuple[int, Any]:
        query = self._query("/sleep")
        level = int(query.get("level", ["1"])[0])
        mode = query.get("mode", ["abort"])[0]
        if mode not in ("abort", "wait", "keep"):
            return 400, {"object": "error", "message": f"invalid mode {mode!r}", "type": "BadRequestError"}
        with self._changed:
            if mode == "abort":
                self._epoch += 1  # the requests in flight end now, with an error
                self._changed.notify_all()
            else:
                self.draining = True
                self._changed.wait_for(lambda: self.running == 0)
            self.draining = False
            self.sleeping, self.level = True, level
            self.sleeps += 1
        self._publish()
        return 200, None

    def _fault_route(self, body: Any) -> tuple[int, Any]:
        self.wake_fault = str((body or {}).get("fault", ""))
        return 200, {"fault": self.wake_fault}

    def _wake_route(self, body: Any) -> tuple[int, Any]:
        if self.wake_fault == "500":
            return 500, {"object": "error", "message": "CUDA error: out of memory", "type": "InternalServerError"}
        time.sleep(self.wake_s)  # the weights come back from CPU memory
        with self._changed:
            self.sleeping, self.level = False, 0
            self.wakes += 1
            self._changed.notify_all()
        self._publish()
        return 200, None

    def _completion_route(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or body.get("model") != self.model:
            return 404, {"object": "error", "message": f"The model `{(body or {}).get('model')}` does not exist."}
        if not self._generate():
            return 500, {"object": "error", "message": "the request was aborted", "type": "InternalServerError"}
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _generate(self) -> bool:
        """One request: held while it sleeps or drains, then ``gen_s`` of work; False when a
        sleep aborted it."""
        with self._changed:
            self.waiting += 1
            self._changed.wait_for(lambda: not self.sleeping and not self.draining)
            self.waiting -= 1
            self.running += 1
            epoch = self._epoch
        self._publish()
        with self._changed:
            aborted = self._changed.wait_for(lambda: self._epoch != epoch, timeout=self.gen_s)
            self.running -= 1
            self.aborted += 1 if aborted else 0
            self._changed.notify_all()
        self._publish()
        return not aborted


def main(argv: list[str] | None = None) -> int:
    parser = fake_parser("arbiter_testing.fake_vllm")
    parser.add_argument("--held-gb", type=float, default=13.0, help="weights and KV cache, preallocated")
    parser.add_argument("--gen-s", type=float, default=0.5)
    parser.add_argument("--wake-s", type=float, default=0.2)
    parser.add_argument("--wake-fault", choices=["", "500"], default="", help="answer /wake_up with HTTP 500")
    parser.add_argument("--api-key", default="", help="as --api-key: /v1 routes need it")
    args = parser.parse_args(argv)
    board = board_of(args)
    fake = FakeVllmServer(board, held_bytes=int(args.held_gb * GIB), gen_s=args.gen_s, wake_s=args.wake_s)
    fake.wake_fault = args.wake_fault
    fake.api_key = args.api_key
    return serve_until_stopped(fake, args.ready_file)


if __name__ == "__main__":
    raise SystemExit(main())
