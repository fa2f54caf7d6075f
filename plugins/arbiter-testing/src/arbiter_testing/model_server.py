"""A small model server that holds real memory: N GiB per model it loads, on the GPU (CUDA,
through PyTorch) where there is one, or on a :class:`VramBoard` for tests without one.

It answers the local LLM server's documented API, so the shipped ``llm-server`` rule drives
it: ``GET /api/ps`` lists the loaded models with their ``size_vram``; ``POST /api/generate``
with a model and no prompt loads it (allocates its memory) and with ``"keep_alive": 0``
unloads it (frees its memory, answered with ``"done_reason": "unload"``).  Run it on a GPU
with ``python -m arbiter_testing.model_server --gib 8`` (it prints its address), beside a
demander that needs that memory.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

GIB = 1 << 30


class Memory(Protocol):
    """Where a model's memory lives."""

    def hold(self, name: str, nbytes: int) -> None: ...
    def free(self, name: str) -> None: ...


class CudaMemory:
    """Real device memory, allocated through PyTorch and given back to the driver on free
    (``empty_cache``: PyTorch otherwise keeps freed blocks for itself)."""

    def __init__(self, device: str = "cuda") -> None:
        self._torch: Any = importlib.import_module("torch")  # only on a GPU host
        self.device = device
        self._blocks: dict[str, Any] = {}

    def hold(self, name: str, nbytes: int) -> None:
        block = self._torch.empty(nbytes, dtype=self._torch.uint8, device=self.device)
        block.fill_(1)  # touched, so the driver really backs it
        self._torch.cuda.synchronize()
        self._blocks[name] = block

    def free(self, name: str) -> None:
        self._blocks.pop(name, None)
        self._torch.cuda.synchronize()
        self._torch.cuda.empty_cache()


class BoardMemory:
    """Memory written to the fake reader's VRAM board as this process's (tests without a GPU)."""

    def __init__(self, board_path: str, total_gib: float = 24.0) -> None:
        from arbiter_testing.vram_board import VramBoard

        self.board = VramBoard(board_path, int(total_gib * GIB))
        self._held: dict[str, int] = {}

    def hold(self, name: str, nbytes: int) -> None:
        self._held[name] = nbytes
        self.board.set(os.getpid(), sum(self._held.values()), 0.0)

    def free(self, name: str) -> None:
        self._held.pop(name, None)
        self.board.set(os.getpid(), sum(self._held.values()), 0.0)


class ModelServer:
    """The server: ``models`` maps each model it can load to its size in bytes."""

    def __init__(self, memory: Memory, models: dict[str, int], port: int = 0, host: str = "127.0.0.1") -> None:
        self.memory = memory
        self.catalog = dict(models)
        self.loaded: dict[str, int] = {}
        self.unloads: list[dict[str, Any]] = []  # each unload: model, asked_at, done_at (monotonic)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: a benchmark prints its own
                pass

            def _answer(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/api/ps":
                    self._answer(200, server.ps())
                elif self.path == "/debug/unloads":  # not the real program's: for a benchmark
                    self._answer(200, list(server.unloads))
                else:
                    self._answer(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                if self.path != "/api/generate":
                    self._answer(404, {"error": f"no route {self.path}"})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    code, answer = server.generate(body)
                except (ValueError, TypeError) as exc:
                    code, answer = 400, {"error": f"bad request: {exc}"}
                except Exception as exc:  # an allocation the device cannot give
                    code, answer = 500, {"error": f"{type(exc).__name__}: {exc}"}
                self._answer(code, answer)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="model-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for name in list(self.loaded):
            self.memory.free(name)

    def ps(self) -> dict[str, Any]:
        with self._lock:
            return {
                "models": [
                    {"name": n, "model": n, "size": size, "size_vram": size, "details": {"format": "raw"}}
                    for n, size in self.loaded.items()
                ]
            }

    def generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("model")
        if not isinstance(name, str) or name not in self.catalog:
            return 404, {"error": f"model {name!r} not found; it serves {sorted(self.catalog)}"}
        now = datetime.now(UTC).isoformat()
        with self._lock:
            if body.get("keep_alive") in (0, "0", "0s"):
                asked = time.monotonic()
                if name in self.loaded:
                    self.memory.free(name)
                    del self.loaded[name]
                    self.unloads.append({"model": name, "asked_at": asked, "done_at": time.monotonic()})
                return 200, {"model": name, "created_at": now, "response": "", "done": True, "done_reason": "unload"}
            if name not in self.loaded:
                self.memory.hold(name, self.catalog[name])
                self.loaded[name] = self.catalog[name]
        return 200, {"model": name, "created_at": now, "response": "", "done": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gib", type=float, default=4.0, help="the memory of its one model, in GiB")
    ap.add_argument("--model", default="weights:latest", help="its model's name")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    ap.add_argument("--board", help="hold the memory on this fake reader state file instead of the GPU")
    ap.add_argument("--total-gib", type=float, default=24.0, help="with --board: the stand-in device's memory")
    ap.add_argument("--load", action="store_true", help="load the model at start")
    args = ap.parse_args(argv)
    memory: Memory = BoardMemory(args.board, args.total_gib) if args.board else CudaMemory()
    server = ModelServer(memory, {args.model: int(args.gib * GIB)}, args.port).start()
    if args.load:
        server.generate({"model": args.model})
    print(json.dumps({"url": server.url, "pid": os.getpid(), "model": args.model}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
