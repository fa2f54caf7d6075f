"""The GPU work ``gpu_truth.py`` measures, run as child processes: on an NVIDIA GPU through
PyTorch, or with ``--dry`` on a CPU core standing in for it (its "VRAM" written to a fake
reader's board, its CUDA state to the fake driver's folder).

    python bench/gpu_truth_work.py duty --duty 0.3 --unit-ms 5 --seconds 8
    python bench/gpu_truth_work.py queue --kernel-ms 50 --inflight 4 --log kernels.txt [--cooperative]
    python bench/gpu_truth_work.py train --steps 60 --seed 7 --hold-gib 8 --losses losses.txt [--progress p.log]
    python bench/gpu_truth_work.py hold --gib 4

Each prints one JSON line when it is ready (its pid, the memory it holds, what PyTorch reserved).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from arbiter.sdk import CONTROL_ENV, Control, Duty

GIB = 1 << 30


class Gpu:
    """Units of matmul on the GPU, sized to last about ``ms`` each."""

    def __init__(self) -> None:
        self.torch: Any = importlib.import_module("torch")
        self.dev = self.torch.device("cuda")
        self.a = self.torch.randn(4096, 4096, device=self.dev)
        self.b = self.torch.randn(4096, 4096, device=self.dev)
        self.held: list[Any] = []
        self._per_ms = self._calibrate()

    def _calibrate(self) -> float:
        """Matmuls of 4096² per millisecond."""
        for _ in range(3):
            self.a @ self.b
        self.torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            self.a @ self.b
        self.torch.cuda.synchronize()
        return 20 / ((time.perf_counter() - started) * 1000)

    def launch(self, ms: float) -> Any:
        """Queue about ``ms`` of matmuls; an event that completes with them."""
        for _ in range(max(1, round(ms * self._per_ms))):
            self.a @ self.b
        event = self.torch.cuda.Event()
        event.record()
        return event

    def unit(self, ms: float) -> None:
        self.launch(ms).synchronize()

    def hold(self, nbytes: int) -> None:
        block = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)
        block.fill_(1)
        self.held.append(block)
        self.torch.cuda.synchronize()

    def reserved(self) -> int:
        return int(self.torch.cuda.memory_reserved())


class Cpu:
    """The dry run's stand-in: a unit spins a core; memory is written to the board, and the
    process says it "uses CUDA" in the fake driver's folder (its checkpoint calls find it)."""

    def __init__(self) -> None:
        self.board_path = os.environ["GPU_TRUTH_BOARD"]
        from arbiter_testing.vram_board import VramBoard

        self.board = VramBoard(self.board_path, int(float(os.environ.get("GPU_TRUTH_TOTAL_GIB", "80")) * GIB))
        self.bytes = 256 << 20  # a context's worth, as a CUDA process holds
        self.board.set(os.getpid(), self.bytes)
        Path(os.environ["FAKE_CUDA_DIR"], str(os.getpid())).write_text("running\n")
        self.held: list[int] = []

    def launch(self, ms: float) -> Any:
        self.unit(ms)
        return None

    def unit(self, ms: float) -> None:
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass

    def hold(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.board.set(os.getpid(), self.bytes)

    def reserved(self) -> int:
        return self.bytes


def ready(dev: Gpu | Cpu, **extra: Any) -> None:
    print(json.dumps({"pid": os.getpid(), "reserved": dev.reserved(), **extra}), flush=True)


def run_duty(dev: Gpu | Cpu, args: argparse.Namespace) -> None:
    """Units at a duty: ``--duty``, or the one its control document gives (a job under arbiter)."""
    ctl = Control() if os.environ.get(CONTROL_ENV) else None
    duty = Duty(ctl, device="cpu" if isinstance(dev, Cpu) else "gpu")
    if ctl is None:
        duty.set(args.duty)
    if isinstance(dev, Cpu):  # the fake reader's busy share: what the stand-in GPU is asked to be busy
        dev.board.set(os.getpid(), dev.bytes, args.duty)
    ready(dev)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        with duty.unit():
            dev.unit(args.unit_ms)
    print(json.dumps({"busy_s": duty.busy_s, "units": duty.units}), flush=True)


def run_queue(dev: Gpu | Cpu, args: argparse.Namespace) -> None:
    """Keeps ``inflight`` long kernels queued; writes each one's completion time (monotonic)
    as it is seen.  A cooperative one stops queueing while its control document says paused."""
    ctl = Control() if args.cooperative else None
    pending: deque[Any] = deque()
    log = open(args.log, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    ready(dev)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        if ctl is not None:
            ctl.refresh()
            while ctl.state == "paused" and not pending:
                ctl.wait(0.05)
                ctl.refresh()
        if ctl is None or ctl.state != "paused":
            pending.append(dev.launch(args.kernel_ms))
        while pending and (len(pending) >= args.inflight or (ctl is not None and ctl.state == "paused")):
            event = pending.popleft()
            if event is not None:
                event.synchronize()
            log.write(f"{time.monotonic():.6f}\n")


def run_train(dev: Gpu | Cpu, args: argparse.Namespace) -> None:
    """A seeded training loop whose losses (as exact hex floats) must not change across a
    checkpoint and restore; with ``--progress``, tqdm writes its progress there."""
    if args.hold_gib:
        dev.hold(int(args.hold_gib * GIB))
    if isinstance(dev, Cpu):  # it uses the stand-in GPU, as the fake reader sees it
        dev.board.set(os.getpid(), dev.bytes, 0.5)
    losses = open(args.losses, "w", buffering=1) if args.losses else None  # noqa: SIM115
    bar: Any = None
    events = open(args.events, "a", buffering=1) if args.events else None  # noqa: SIM115
    if args.progress:
        tqdm = importlib.import_module("tqdm").tqdm
        bar = tqdm(total=args.steps, file=open(args.progress, "w", buffering=1), mininterval=0, ascii=True)  # noqa: SIM115
    ready(dev)
    if isinstance(dev, Gpu):
        torch = dev.torch
        torch.manual_seed(args.seed)
        torch.use_deterministic_algorithms(True)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(dev.dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        gen = torch.Generator(device=dev.dev).manual_seed(args.seed)
        for _ in range(args.steps):
            x = torch.randn(512, 1024, device=dev.dev, generator=gen)
            loss = (model(x) - x[:, :1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = float(loss.item())
            if losses:
                losses.write(value.hex() + "\n")
            if bar:
                bar.update(1)
            if events:
                events.write(json.dumps({"t": time.time(), "event": "step_done"}) + "\n")
            if args.step_ms:
                dev.unit(args.step_ms)
    else:
        rng, weight = random.Random(args.seed), 1.0
        for _ in range(args.steps):
            x = rng.random()
            weight -= 1e-3 * 2 * (weight * x - x) * x
            if losses:
                losses.write((weight * x - x).hex() + "\n")
            if bar:
                bar.update(1)
            if events:
                events.write(json.dumps({"t": time.time(), "event": "step_done"}) + "\n")
            dev.unit(args.step_ms or 5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="a CPU core stands in for the GPU")
    ap.add_argument("--tag", help="ignored: marks this run's processes in their command line, for a rule to match")
    sub = ap.add_subparsers(dest="mode", required=True)
    d = sub.add_parser("duty")
    d.add_argument("--duty", type=float, required=True)
    d.add_argument("--unit-ms", type=float, default=5.0)
    d.add_argument("--seconds", type=float, default=8.0)
    q = sub.add_parser("queue")
    q.add_argument("--kernel-ms", type=float, default=50.0)
    q.add_argument("--inflight", type=int, default=4)
    q.add_argument("--seconds", type=float, default=60.0)
    q.add_argument("--log", required=True)
    q.add_argument("--cooperative", action="store_true")
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=60)
    t.add_argument("--seed", type=int, default=7)
    t.add_argument("--hold-gib", type=float, default=0.0)
    t.add_argument("--step-ms", type=float, default=0.0, help="GPU work per step besides the model's")
    t.add_argument("--losses")
    t.add_argument("--progress", help="where tqdm writes its progress bar")
    t.add_argument("--events", help="a JSON line per step (step_done), the progress arbiter reads")
    h = sub.add_parser("hold")
    h.add_argument("--gib", type=float, required=True)
    args = ap.parse_args(argv)
    dev: Gpu | Cpu = Cpu() if args.dry else Gpu()
    if args.mode == "duty":
        run_duty(dev, args)
    elif args.mode == "queue":
        run_queue(dev, args)
    elif args.mode == "train":
        run_train(dev, args)
    else:
        dev.hold(int(args.gib * GIB))
        ready(dev)
        while True:
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
