"""Fake LLM servers that say how busy they are through Prometheus ``/metrics``, shaped like
the real ones' documented APIs:

- :class:`FakeLlamaServer`, llama.cpp's ``llama-server`` (port 8080, started with
  ``--metrics``): ``GET /health`` ``{"status": "ok"}``, ``GET /slots`` (one object per slot with
  ``id`` and ``is_processing``), ``POST /completion`` ``{"prompt", "n_predict"}``, and the
  gauges ``llamacpp:requests_processing`` and ``llamacpp:requests_deferred``.
- :class:`FakeSglangServer`, SGLang's ``sglang.launch_server`` (port 30000, started with
  ``--enable-metrics --enable-memory-saver``): ``POST /generate`` ``{"text", "sampling_params"}``,
  the gauges ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``, and
  ``POST /release_memory_occupation`` / ``POST /resume_memory_occupation`` (JSON body, ``tags``
  optional): its weights and KV cache leave the GPU and come back; released, it cannot generate.
- :class:`FakeTgiServer`, Hugging Face text-generation-inference (``text-generation-launcher``,
  port 3000): ``GET /health``, ``GET /info``, ``POST /generate`` ``{"inputs", "parameters"}``,
  and the gauges ``tgi_batch_current_size`` and ``tgi_queue_size``.

Each preallocates its KV cache, as the real ones do: it holds the same VRAM idle or busy.
Their VRAM goes to a :class:`VramBoard` for the ``fake`` reader.  Run one as a process:
``python -m arbiter_testing.fake_llm_servers llamacpp|sglang|tgi --state-file F --ready-file R``.
"""

from __future__ import annotations

import time
from typing import Any

from arbiter_testing.fake_preallocated import PreallocatedServer
from arbiter_testing.fake_process import board_of, fake_parser, serve_until_stopped
from arbiter_testing.vram_board import GIB, VramBoard


class _GaugedServer(PreallocatedServer):
    """What the three share: requests that run for ``gen_s`` each, counted in gauges."""

    running_gauge = ""
    waiting_gauge = ""
    labels = ""

    def __init__(
        self, board: VramBoard, held_bytes: int = 8 * GIB, gen_s: float = 0.5, pid: int | None = None, port: int = 0
    ) -> None:
        super().__init__(board, held_bytes, gen_s, pid, port)
        self.released = False
        self._publish()

    def given_up(self) -> bool:
        return self.released

    def metrics(self) -> bytes:
        with self._lock:
            running = self.running
        return (
            f"# HELP {self.running_gauge} Requests being processed.\n# TYPE {self.running_gauge} gauge\n"
            f"{self.running_gauge}{self.labels} {float(running)}\n"
            f"# HELP {self.waiting_gauge} Requests waiting.\n# TYPE {self.waiting_gauge} gauge\n"
            f"{self.waiting_gauge}{self.labels} 0.0\n"
        ).encode()

    def _run(self) -> tuple[int, Any] | None:
        """One request's work; an error answer where it cannot run."""
        return self._work(
            lambda: (503, {"error": "the memory is released: resume it first"}) if self.released else None
        )


class FakeLlamaServer(_GaugedServer):
    running_gauge = "llamacpp:requests_processing"
    waiting_gauge = "llamacpp:requests_deferred"
    SLOTS = 4

    def __init__(self, board: VramBoard, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.routes[("GET", "/health")] = lambda body: (200, {"status": "ok"})
        self.routes[("GET", "/metrics")] = lambda body: (200, self.metrics())
        self.routes[("GET", "/slots")] = lambda body: (200, self.slots())
        self.routes[("POST", "/completion")] = self._completion

    def slots(self) -> list[dict[str, Any]]:
        with self._lock:
            busy = self.running
        return [{"id": i, "n_ctx": 4096, "is_processing": i < busy} for i in range(self.SLOTS)]

    def _completion(self, body: Any) -> tuple[int, Any]:
        failed = self._run()
        return failed or (200, {"content": " ok", "stop": True, "tokens_predicted": 1})


class FakeSglangServer(_GaugedServer):
    running_gauge = "sglang:num_running_reqs"
    waiting_gauge = "sglang:num_queue_reqs"
    labels = '{model_name="Qwen/Qwen2.5-7B-Instruct"}'

    def __init__(self, board: VramBoard, resume_s: float = 0.2, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.resume_s = resume_s
        self.releases = 0
        self.resumes = 0
        self.routes[("GET", "/health")] = lambda body: (200, None)
        self.routes[("GET", "/metrics")] = lambda body: (200, self.metrics())
        self.routes[("POST", "/generate")] = self._generate
        self.routes[("POST", "/release_memory_occupation")] = self._release
        self.routes[("POST", "/resume_memory_occupation")] = self._resume

    def _generate(self, body: Any) -> tuple[int, Any]:
        failed = self._run()
        return failed or (200, {"text": " ok", "meta_info": {"finish_reason": {"type": "length"}}})

    def _release(self, body: Any) -> tuple[int, Any]:
        with self._lock:
            self.released = True
            self.releases += 1
        self._publish()
        return 200, None

    def _resume(self, body: Any) -> tuple[int, Any]:
        time.sleep(self.resume_s)  # the weights come back
        with self._lock:
            self.released = False
            self.resumes += 1
        self._publish()
        return 200, None


class FakeTgiServer(_GaugedServer):
    running_gauge = "tgi_batch_current_size"
    waiting_gauge = "tgi_queue_size"

    def __init__(self, board: VramBoard, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.routes[("GET", "/health")] = lambda body: (200, None)
        self.routes[("GET", "/info")] = lambda body: (
            200,
            {"model_id": "bigscience/bloom-560m", "max_concurrent_requests": 128},
        )
        self.routes[("GET", "/metrics")] = lambda body: (200, self.metrics())
        self.routes[("POST", "/generate")] = self._generate

    def _generate(self, body: Any) -> tuple[int, Any]:
        failed = self._run()
        return failed or (200, {"generated_text": " ok"})


SERVERS: dict[str, type[_GaugedServer]] = {
    "llamacpp": FakeLlamaServer,
    "sglang": FakeSglangServer,
    "tgi": FakeTgiServer,
}


def main(argv: list[str] | None = None) -> int:
    parser = fake_parser("arbiter_testing.fake_llm_servers")
    parser.add_argument("program", choices=sorted(SERVERS))
    parser.add_argument("--held-gb", type=float, default=8.0, help="weights and KV cache, preallocated")
    parser.add_argument("--gen-s", type=float, default=0.5)
    args = parser.parse_args(argv)
    board = board_of(args)
    fake = SERVERS[args.program](board, held_bytes=int(args.held_gb * GIB), gen_s=args.gen_s)
    return serve_until_stopped(fake, args.ready_file)


if __name__ == "__main__":
    raise SystemExit(main())
