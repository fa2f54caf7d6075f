"""A fake vLLM OpenAI-compatible server with sleep mode, shaped like the real one's documented API.

- ``GET /health``: 200 while it serves.
- ``GET /v1/models``: ``{"object": "list", "data": [{"id": MODEL, "object": "model", ...}]}``.
- ``GET /metrics``: the Prometheus text format, with the gauges ``vllm:num_requests_running``
  and ``vllm:num_requests_waiting`` labelled ``model_name`` (and a counter beside them).
- ``POST /v1/completions`` ``{"model", "prompt", "max_tokens"}``: runs for ``gen_s`` (the
  running gauge counts it), then answers a ``text_completion``; while asleep it fails.
- ``POST /sleep?level=1`` (sleep mode, served with ``VLLM_SERVER_DEV_MODE=1``): level 1
  offloads the weights to CPU memory and discards the KV cache, so the VRAM falls to what the
  CUDA context keeps; answered 200 with no body once done.  ``POST /wake_up``: the weights
  and cache come back over ``wake_s``, then 200.  ``GET /is_sleeping``: ``{"is_sleeping": bool}``.

Like the real server it preallocates its KV cache: it holds the same VRAM idle or busy, so
VRAM cannot say whether it works.  Its VRAM goes to a :class:`VramBoard` for the ``fake``
reader.  Run as a process: ``python -m arbiter_testing.fake_vllm --state-file F --ready-file R``.
"""

from __future__ import annotations

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
            running = self.running
        label = f'{{engine="0",model_name="{self.model}"}}'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{label} {float(running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{label} 0.0\n"
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
        level = int(self._query("/sleep").get("level", ["1"])[0])
        with self._lock:
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
        with self._lock:
            self.sleeping, self.level = False, 0
            self.wakes += 1
        self._publish()
        return 200, None

    def _completion_route(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or body.get("model") != self.model:
            return 404, {"object": "error", "message": f"The model `{(body or {}).get('model')}` does not exist."}
        asleep = {"object": "error", "message": "the engine is sleeping", "type": "InternalServerError"}
        refused = self._work(lambda: (500, asleep) if self.sleeping else None)
        if refused is not None:
            return refused
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


def main(argv: list[str] | None = None) -> int:
    parser = fake_parser("arbiter_testing.fake_vllm")
    parser.add_argument("--held-gb", type=float, default=13.0, help="weights and KV cache, preallocated")
    parser.add_argument("--gen-s", type=float, default=0.5)
    parser.add_argument("--wake-s", type=float, default=0.2)
    parser.add_argument("--wake-fault", choices=["", "500"], default="", help="answer /wake_up with HTTP 500")
    args = parser.parse_args(argv)
    board = board_of(args)
    fake = FakeVllmServer(board, held_bytes=int(args.held_gb * GIB), gen_s=args.gen_s, wake_s=args.wake_s)
    fake.wake_fault = args.wake_fault
    return serve_until_stopped(fake, args.ready_file)


if __name__ == "__main__":
    raise SystemExit(main())
