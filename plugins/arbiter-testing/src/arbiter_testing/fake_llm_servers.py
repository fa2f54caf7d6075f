"""Fake LLM servers that say how busy they are through Prometheus ``/metrics``, shaped like
the real ones' documented APIs:

- :class:`FakeLlamaServer`, llama.cpp's ``llama-server`` (port 8080), following
  ``tools/server/server.cpp`` (the routes, ``--api-key`` asking every route but ``/health``
  and ``/models`` for it; router mode proxying ``/metrics`` and ``/slots`` to a model's
  child), ``tools/server/server-context.cpp`` (``GET /slots``, on by default, reads the
  slots and changes nothing; ``GET /metrics``, with ``--metrics``, sets the metrics task's
  ``metrics_reset_bucket``, and that task empties the bucket that
  ``llamacpp:predicted_tokens_seconds`` is averaged over: every read starts a new window,
  for every reader) and ``tools/server/server-models.cpp`` (router mode):
  ``GET /health`` ``{"status": "ok"}``, ``GET /slots`` (one object per slot with ``id`` and
  ``is_processing``), ``POST /completion`` ``{"prompt", "n_predict"}``, the gauges
  ``llamacpp:requests_processing`` and ``llamacpp:requests_deferred``, and the throughput
  ``llamacpp:tokens_predicted_total`` (a counter) and ``llamacpp:predicted_tokens_seconds``
  (the bucket's average).  With ``router`` (started without a model: one child server per
  model, loaded on demand), ``GET /metrics`` and ``GET /slots`` without ``?model=NAME``
  answer 400, ``GET /models`` lists each model with its ``status.value`` (``loaded``,
  ``unloaded``), a request's ``model`` loads it, and ``POST /models/unload`` ``{"model"}``
  stops its child (its VRAM comes back).
- :class:`FakeSglangServer`, SGLang 0.5 (``sglang serve`` or ``python -m sglang.launch_server``,
  port 30000, started with ``--enable-metrics --enable-memory-saver``), following
  ``python/sglang/srt/entrypoints/http_server.py`` (the routes, guarded by ``--api-key`` /
  ``--admin-api-key``), ``python/sglang/srt/managers/io_struct.py``
  (``PauseGenerationReqInput.mode``: ``abort``, the default, ``retract`` or ``in_place``),
  ``python/sglang/srt/managers/tokenizer_manager.py`` (``pause_generation`` holds every new
  request until ``continue_generation``; in ``abort`` mode it aborts every request in flight
  and answers once none is left), ``python/sglang/srt/managers/scheduler.py`` (a pause stops
  the scheduler from running batches; ``retract`` puts the running requests back in the
  waiting queue, their KV cache freed, to be computed again after ``continue_generation``;
  ``in_place`` leaves them in the running batch), ``scheduler_update_weights_mixin.py``
  (``release_memory_occupation`` asserts that the scheduler is fully idle, the waiting queue
  not counted while generation is paused; the assertion escapes the scheduler's loop, and
  the launcher kills the whole server) and ``python/sglang/srt/metrics/collector.py`` (the
  gauges): ``POST /generate`` ``{"text", "sampling_params"}``, the gauges
  ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``, ``POST /pause_generation``
  ``{"mode"}`` and ``POST /continue_generation``, and ``POST /release_memory_occupation`` /
  ``POST /resume_memory_occupation`` (JSON body, ``tags`` optional): its weights and KV cache
  leave the GPU and come back.  A release while a request runs (or waits, generation not
  paused) kills the server (its VRAM goes with it; ``crashed``).  A request that arrives while
  its memory is released is not refused: it waits in the queue until the memory is resumed.
- :class:`FakeTgiServer`, Hugging Face text-generation-inference 3.3 (``text-generation-launcher``,
  port 3000), following its router (``router/src/server.rs``: the routes and the Prometheus
  exporter; ``router/src/infer/queue.rs`` and ``backends/v3/src/backend.rs``: the gauges):
  ``GET /health``, ``GET /info``, ``POST /generate`` ``{"inputs", "parameters"}``, and the
  gauges ``tgi_batch_current_size`` and ``tgi_queue_size``, which the exporter publishes
  only once they are first set: until its first request, ``/metrics`` has neither.

Each preallocates its KV cache, as the real ones do: it holds the same VRAM idle or busy.
Their VRAM goes to a :class:`VramBoard` for the ``fake`` reader.  Run one as a process:
``python -m arbiter_testing.fake_llm_servers llamacpp|sglang|tgi --state-file F --ready-file R``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from arbiter_testing.fake_http import WORKING_SHARE
from arbiter_testing.fake_preallocated import CONTEXT_BYTES, PreallocatedServer
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
    ROUTER_MODEL = "qwen2.5-7b"

    def __init__(self, board: VramBoard, router: bool = False, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.router = router
        # in router mode its one model is not loaded until a request names it
        self.released = router
        self._publish()
        self.open_paths = frozenset({"/health", "/models", "/v1/models"})
        self.routes[("GET", "/health")] = lambda body: (200, {"status": "ok"})
        self.routes[("GET", "/metrics")] = self._metrics
        self.routes[("GET", "/slots")] = self._slots
        # what it has predicted since it started, and since the last read of /metrics (its
        # bucket: the throughput gauges are averaged over it, and a read of /metrics empties it)
        self.predicted = self.predicted_s = 0.0
        self.bucket = self.bucket_s = 0.0
        self.routes[("GET", "/models")] = lambda body: (200, self.models())
        self.routes[("POST", "/models/unload")] = self._unload
        self.routes[("POST", "/completion")] = self._completion

    def _query(self, path: str) -> dict[str, list[str]]:
        """The query of the latest request to ``path`` (routes are given the body only)."""
        for seen in reversed(self.requests()):
            split = urlsplit(seen.path)
            if split.path == path:
                return parse_qs(split.query)
        return {}

    def _unrouted(self, path: str) -> tuple[int, Any] | None:
        """Router mode's answer to a GET it proxies without ``?model=`` naming its model."""
        if self.router and self._query(path).get("model") != [self.ROUTER_MODEL]:
            error = {"code": 400, "message": "model name is missing from the request", "type": "invalid_request_error"}
            return 400, {"error": error}
        return None

    def _metrics(self, body: Any) -> tuple[int, Any]:
        return self._unrouted("/metrics") or (200, self.metrics())

    def _slots(self, body: Any) -> tuple[int, Any]:
        return self._unrouted("/slots") or (200, self.slots())

    def metrics(self) -> bytes:
        """The page, and the bucket emptied: every read of /metrics starts a new window."""
        with self._lock:
            predicted, predicted_s, bucket, bucket_s = self.predicted, self.predicted_s, self.bucket, self.bucket_s
            self.bucket = self.bucket_s = 0.0
        rate = bucket / bucket_s if bucket_s else 0.0
        return (
            super().metrics()
            + (
                "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
                f"# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total {predicted}\n"
                "# HELP llamacpp:tokens_predicted_seconds_total Predict process time\n"
                "# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
                f"llamacpp:tokens_predicted_seconds_total {predicted_s:.3f}\n"
                "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.\n"
                f"# TYPE llamacpp:predicted_tokens_seconds gauge\nllamacpp:predicted_tokens_seconds {rate:.3f}\n"
            ).encode()
        )

    def models(self) -> dict[str, Any]:
        with self._lock:
            status = "unloaded" if self.released else "loaded"
        return {"data": [{"id": self.ROUTER_MODEL, "object": "model", "status": {"value": status}}]}

    def _unload(self, body: Any) -> tuple[int, Any]:
        if not self.router:
            return 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
        if not isinstance(body, dict) or body.get("model") != self.ROUTER_MODEL:
            return 400, {"error": {"code": 400, "message": "model not found", "type": "invalid_request_error"}}
        with self._lock:
            self.released = True
        self._publish()
        return 200, {"success": True}

    def slots(self) -> list[dict[str, Any]]:
        with self._lock:
            busy = self.running
        return [{"id": i, "n_ctx": 4096, "is_processing": i < busy} for i in range(self.SLOTS)]

    def _completion(self, body: Any) -> tuple[int, Any]:
        if self.router:  # the model it names is loaded first (its child server starts)
            with self._lock:
                self.released = False
            self._publish()
        failed = self._run()
        if failed:
            return failed
        tokens = max(1, int(body.get("n_predict", 16))) if isinstance(body, dict) else 16
        with self._lock:  # counted once the request ends, in the totals and in the bucket
            self.predicted += tokens
            self.bucket += tokens
            self.predicted_s += self.gen_s
            self.bucket_s += self.gen_s
        return 200, {"content": " ok", "stop": True, "tokens_predicted": tokens}


class FakeSglangServer(_GaugedServer):
    running_gauge = "sglang:num_running_reqs"
    waiting_gauge = "sglang:num_queue_reqs"
    labels = '{model_name="Qwen/Qwen2.5-7B-Instruct"}'
    #: what ``POST /pause_generation`` does with the requests in flight (``mode``, default abort)
    PAUSE_MODES = ("abort", "retract", "in_place")

    def __init__(self, board: VramBoard, resume_s: float = 0.2, **kwargs: Any) -> None:
        super().__init__(board, **kwargs)
        self.resume_s = resume_s
        self.releases = 0
        self.resumes = 0
        self.queued = 0  # the scheduler's waiting queue: new, retracted, or waiting for the memory
        self.paused = ""  # the pause mode in force, "" while it generates
        self.aborts = 0  # how many times every request in flight was aborted
        self.aborted = 0  # requests answered aborted
        self.crashed = False  # a release reached it busy: the server is gone
        #: what its death does beyond stopping to serve (a process exits)
        self.on_crash: Callable[[], None] = lambda: None
        self._changed = threading.Condition(self._lock)
        # with --api-key, every route but these asks for it
        self.open_paths = frozenset({"/health", "/health_generate", "/metrics"})
        self.routes[("GET", "/health")] = lambda body: (200, None)
        self.routes[("GET", "/metrics")] = lambda body: (200, self.metrics())
        self.routes[("POST", "/generate")] = self._generate
        self.routes[("POST", "/pause_generation")] = self._pause
        self.routes[("POST", "/continue_generation")] = self._continue
        self.routes[("POST", "/release_memory_occupation")] = self._release
        self.routes[("POST", "/resume_memory_occupation")] = self._resume

    def metrics(self) -> bytes:
        with self._lock:
            running, queued = self.running, self.queued
        return (
            f"# HELP {self.running_gauge} The number of running requests.\n# TYPE {self.running_gauge} gauge\n"
            f"{self.running_gauge}{self.labels} {float(running)}\n"
            f"# HELP {self.waiting_gauge} The number of requests in the waiting queue.\n"
            f"# TYPE {self.waiting_gauge} gauge\n{self.waiting_gauge}{self.labels} {float(queued)}\n"
        ).encode()

    def _board_now(self) -> None:
        """:meth:`_publish` for a caller that holds the lock."""
        held = CONTEXT_BYTES if self.released else self.full_bytes
        self.board.set(self.pid, held, WORKING_SHARE if self.running else 0.0)

    def _generate(self, body: Any) -> tuple[int, Any]:
        with self._changed:
            # the tokenizer manager holds a new request while generation is paused
            self._changed.wait_for(lambda: not self.paused or self.crashed)
            self.queued += 1
            return self._schedule(self.aborts)

    def _schedule(self, epoch: int) -> tuple[int, Any]:
        """One request through the scheduler (called holding the lock): queued until it may
        run, run for ``gen_s``, and what a pause, an abort or the server's death does to it."""
        left, running = self.gen_s, False
        while True:
            if self.crashed or self.aborts != epoch:
                if running:
                    self.running -= 1
                else:
                    self.queued -= 1
                self._board_now()
                self._changed.notify_all()
                if self.crashed:
                    return 502, {"error": "the server is gone"}
                self.aborted += 1
                return 200, {"text": "", "meta_info": {"finish_reason": {"type": "abort"}}}
            if not running:
                if self.paused or self.released:  # waits in the queue
                    self._changed.wait()
                    continue
                self.queued, self.running, running = self.queued - 1, self.running + 1, True
                self._board_now()
            elif self.paused == "retract":  # back to the queue, its KV cache freed: it starts over
                self.queued, self.running, running, left = self.queued + 1, self.running - 1, False, self.gen_s
                self._board_now()
                self._changed.notify_all()
            elif self.paused:  # in place: it stays in the running batch, frozen
                self._changed.wait()
            elif left <= 0:
                self.running -= 1
                self._board_now()
                self._changed.notify_all()
                return 200, {"text": " ok", "meta_info": {"finish_reason": {"type": "length"}}}
            else:
                began = time.monotonic()
                self._changed.wait(timeout=left)
                left -= time.monotonic() - began

    def _pause(self, body: Any) -> tuple[int, Any]:
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in self.PAUSE_MODES:
            return 400, {"error": f"Invalid mode: {mode!r}. Expected one of {list(self.PAUSE_MODES)}."}
        with self._changed:
            self.paused = mode
            if mode == "abort":  # every request in flight ends now, answered aborted
                self.aborts += 1
            self._changed.notify_all()
            if mode != "in_place":  # answered once none is running (abort: none is left at all)
                self._changed.wait_for(lambda: self.running == 0 and (mode != "abort" or self.queued == 0), timeout=30)
        return 200, b"Generation paused successfully."

    def _continue(self, body: Any) -> tuple[int, Any]:
        with self._changed:
            self.paused = ""
            self._changed.notify_all()
        return 200, b"Generation continued successfully."

    def _release(self, body: Any) -> tuple[int, Any]:
        with self._lock:
            # the scheduler asserts that it is fully idle; the requests a pause put back in the
            # queue do not count while it is paused
            idle = self.running == 0 and (self.queued == 0 or bool(self.paused))
            if idle:
                self.released = True
                self.releases += 1
            else:
                self.crashed = True
        if not idle:  # the scheduler's assertion: the whole server goes down
            threading.Thread(target=self._die, daemon=True).start()
            return 500, {"error": "release_memory_occupation should be called only when server is idle."}
        self._publish()
        return 200, None

    def _die(self) -> None:
        self.board.remove(self.pid)
        with self._changed:
            self._changed.notify_all()
        self.on_crash()

    def _resume(self, body: Any) -> tuple[int, Any]:
        time.sleep(self.resume_s)  # the weights come back
        with self._changed:
            self.released = False
            self.resumes += 1
            self._changed.notify_all()
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
        self.served = False  # its gauges exist once a request has set them

    def metrics(self) -> bytes:
        with self._lock:
            served = self.served
        return super().metrics() if served else b""

    def _generate(self, body: Any) -> tuple[int, Any]:
        with self._lock:
            self.served = True
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
    parser.add_argument("--api-key", default="", help="as its --api-key: its routes need it")
    parser.add_argument("--router", action="store_true", help="llamacpp: router mode (started without a model)")
    args = parser.parse_args(argv)
    board = board_of(args)
    more = {"router": True} if args.router and args.program == "llamacpp" else {}
    fake = SERVERS[args.program](board, held_bytes=int(args.held_gb * GIB), gen_s=args.gen_s, **more)
    fake.api_key = args.api_key
    if isinstance(fake, FakeSglangServer):
        fake.on_crash = lambda: os._exit(1)  # as the real launcher kills its process tree
    return serve_until_stopped(fake, args.ready_file)


if __name__ == "__main__":
    raise SystemExit(main())
