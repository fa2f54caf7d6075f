"""What arbiter's GPU claims are worth on a real NVIDIA GPU, in one short prepared run.

    uv run python bench/gpu_truth.py                    # on a GPU machine (about 10 minutes)
    uv run python bench/gpu_truth.py --dry-run          # anywhere: fakes of NVML and the driver
    uv run python bench/gpu_truth.py --parts pause,checkpoint --redo

Parts, each a figure with the GPU and driver named (``--parts`` picks them; a part already
done is kept and skipped, so a run cut short goes on where it stopped; ``--redo`` runs them
again):

- ``readers``: a job held at duties 0.1…0.9 by ``arbiter.sdk.Duty`` (5 ms units of matmul):
  the ``nvml`` reader's measured duty against the asked one (goal |error| ≤ 0.03) and against
  NVML's own per-process samples read independently; the reader's cost per read; the VRAM it
  attributes against what PyTorch reserved.
- ``pause``: a job keeping four 50 ms kernels queued, paused by each translator (control
  document, SIGSTOP, cgroup freeze, cuda_checkpoint): time from the pause to its last kernel's
  completion and to NVML's utilisation reading zero, and the VRAM it still holds while paused.
- ``checkpoint``: a seeded training loop holding N GiB, paused by ``cuda_checkpoint`` and
  resumed: VRAM freed, time to checkpoint and to restore, and its loss sequence bitwise equal
  to an unpaused run's.
- ``handoff``: a model server holding N GiB gives it to a tenant short of VRAM, then a job
  holding N GiB gives it by being checkpointed; ``protected``: a training loop as the
  protected program earns (or refuses) a certificate in a short A/B run, then the governor
  runs beside it (a real daemon; bench/gpu_truth_daemon.py).

It only reads the device: every NVML call that would change a setting (power limit, clocks,
compute mode, MIG, persistence) is refused, and so is ``--apply-profile``.  ``--dry-run``
runs every part here against a simulated NVML (a process's CPU time stands in for its GPU
time), the fake CUDA driver library and a CPU core, to prove the script before a GPU is lent.
Results go to ``--out`` (results.json, report.md).

One file past 400 lines: a bench script is run by its path, and it is the one prepared run a
GPU machine is lent for, each part beside the others it reports with.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_truth_dry import ReadOnlyNvml, SimulatedNvml  # noqa: E402

from arbiter.plugin import ControlUpdate, JobTarget, PluginContext, ProcessRef, Translator  # noqa: E402
from arbiter.sdk.control import write_control_document  # noqa: E402
from arbiter_readers.nvml import NvmlReader  # noqa: E402
from arbiter_testing.fake_cuda import build as build_fake_cuda  # noqa: E402

GIB = 1 << 30
WORK = ROOT / "bench" / "gpu_truth_work.py"
PARTS = ("readers", "pause", "checkpoint", "handoff", "protected")
GOAL_DUTY_ERROR = 0.03
Figures = dict[str, Any]


class Refused(SystemExit):
    pass


class Rig:
    """The device and how work is started on it: the real GPU, or the dry run's stand-ins."""

    def __init__(self, out: Path, dry: bool) -> None:
        self.out, self.dry = out, dry
        self.children: list[subprocess.Popen[str]] = []
        self.env = dict(os.environ)
        self.library = "libcuda.so.1"
        if dry:
            stand = out / "dry"
            stand.mkdir(parents=True, exist_ok=True)
            self.board = stand / "board.json"
            self.board.unlink(missing_ok=True)
            self.cuda_dir = stand / "driver"
            self.cuda_dir.mkdir(exist_ok=True)
            self.library = str(build_fake_cuda(stand / "lib", utility=False))
            self.total = 80 * GIB
            self.env.update(
                GPU_TRUTH_BOARD=str(self.board),
                GPU_TRUTH_TOTAL_GIB="80",
                FAKE_CUDA_DIR=str(self.cuda_dir),
                LD_LIBRARY_PATH=str(stand / "lib"),
            )
            os.environ["FAKE_CUDA_DIR"] = str(self.cuda_dir)  # the translator runs in this process
            self.nvml: Any = SimulatedNvml(self.board, self.cuda_dir, self.total)
        else:
            import importlib

            self.nvml = ReadOnlyNvml(importlib.import_module("pynvml"))
        self.nvml.nvmlInit()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(0)

    def device(self) -> dict[str, str]:
        name = self.nvml.nvmlDeviceGetName(self.handle)
        driver = self.nvml.nvmlSystemGetDriverVersion()
        total = int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).total)
        return {
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
            "memory_gib": f"{total / GIB:.0f}",
            "host": platform.node(),
            "dry_run": str(self.dry),
        }

    def reader(self) -> NvmlReader:
        options = NvmlReader.Options.model_validate({"kind": "nvml"})
        return NvmlReader(options, PluginContext(state_dir=self.out), nvml=self.nvml)

    def context(self) -> PluginContext:
        return PluginContext(state_dir=self.out, note=lambda *a: None)

    def work(self, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        """Start a workload; its ready line (pid, reserved memory)."""
        argv = [sys.executable, str(WORK), *(["--dry"] if self.dry else []), *args]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**self.env, **(env or {})})
        self.children.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(30)
            raise RuntimeError(f"{' '.join(args)} exited ({proc.returncode}) before it was ready")
        return proc, json.loads(line)

    def forget_the_dead(self) -> None:
        """The dry run's board keeps what each stand-in wrote until it is removed: a process
        that has ended holds nothing, as on a GPU."""
        if not self.dry:
            return
        board = self.nvml.board
        for pid in list(board._read().get("processes", {})):
            if not psutil.pid_exists(int(pid)):
                board.remove(int(pid))

    def free_bytes(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).free)

    def utilization(self) -> int:
        return int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def close(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def ref_of(pid: int) -> ProcessRef:
    return ProcessRef(pid, psutil.Process(pid).create_time())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


# --- readers ------------------------------------------------------------------------------------


def part_readers(rig: Rig, quick: bool) -> Figures:
    levels = [0.2, 0.5, 0.8] if quick else [round(0.1 * i, 1) for i in range(1, 10)]
    warm, window = (1.0, 2.5) if quick else (1.5, 6.0)
    reader = rig.reader()
    rows: list[dict[str, Any]] = []
    costs: list[float] = []
    for asked in levels:
        proc, info = rig.work("duty", "--duty", str(asked), "--unit-ms", "5", "--seconds", str(warm + window + 2))
        pid = info["pid"]
        time.sleep(warm)
        started = time.perf_counter()
        first = reader.read([pid])
        costs.append(time.perf_counter() - started)
        seen_us = time.time_ns() // 1000
        own: list[tuple[int, int]] = []  # NVML's own samples for the job: (timestamp µs, SM %)
        end = time.monotonic() + window
        while time.monotonic() < end:
            time.sleep(0.25)
            started = time.perf_counter()
            reader.read([pid])
            costs.append(time.perf_counter() - started)
            try:
                samples = rig.nvml.nvmlDeviceGetProcessUtilization(rig.handle, seen_us)
            except Exception:  # NOT_FOUND: no sample newer than the last one
                samples = []
            for s in samples:
                seen_us = max(seen_us, int(s.timeStamp))
                if int(s.pid) == pid:
                    own.append((int(s.timeStamp), int(s.smUtil)))
        last = reader.read([pid])
        proc.wait(60)
        spent = (last.at_ns - first.at_ns) or 1
        sm = last.processes[pid].busy_ns.get("sm", 0) - first.processes[pid].busy_ns.get("sm", 0)
        measured = sm / spent
        nvml_mean = statistics.fmean(u for _, u in own) / 100 if own else float("nan")
        vram = last.processes[pid].vram_bytes
        rows.append(
            {
                "asked": asked,
                "reader": round(measured, 4),
                "error": round(abs(measured - asked), 4),
                "nvml_samples": round(nvml_mean, 4),
                "samples": len(own),
                "vram_attributed": vram,
                "torch_reserved": info["reserved"],
            }
        )
    reader.close()
    worst = max(r["error"] for r in rows)
    lines = [
        "| asked | nvml reader | error | NVML samples (mean SM) | VRAM attributed / reserved |",
        "|---|---|---|---|---|",
        *(
            f"| {r['asked']:.1f} | {r['reader']:.3f} | {r['error']:.3f} | {r['nvml_samples']:.3f} ({r['samples']}) | "
            f"{(r['vram_attributed'] or 0) / GIB:.2f} / {r['torch_reserved'] / GIB:.2f} GiB |"
            for r in rows
        ),
        f"worst |measured − asked| {worst:.3f} (goal ≤ {GOAL_DUTY_ERROR}): {'met' if worst <= GOAL_DUTY_ERROR else 'NOT met'}",
        f"reader cost per read: p50 {1e6 * pct(costs, 0.5):.0f} µs, p99 {1e6 * pct(costs, 0.99):.0f} µs ({len(costs)} reads)",
    ]
    return {"rows": rows, "worst_error": worst, "read_cost_us_p50": 1e6 * pct(costs, 0.5), "lines": lines}


# --- what a pause stops -------------------------------------------------------------------------


def translators(rig: Rig) -> dict[str, Translator]:
    from arbiter_translators import (
        CgroupFreezeTranslator,
        ControlDocTranslator,
        CudaCheckpointTranslator,
        SignalTranslator,
    )

    ctx = rig.context()
    return {
        "control_doc": ControlDocTranslator(ControlDocTranslator.Options(), ctx),
        "signal": SignalTranslator(SignalTranslator.Options(), ctx),
        "cgroup_freeze": CgroupFreezeTranslator(CgroupFreezeTranslator.Options(), ctx),
        "cuda_checkpoint": CudaCheckpointTranslator(
            CudaCheckpointTranslator.Options(backend="driver" if rig.dry else "auto", library=rig.library), ctx
        ),
    }


def completions(log: Path) -> list[float]:
    try:
        return [float(x) for x in log.read_text().split()]
    except (OSError, ValueError):
        return []


def part_pause(rig: Rig, quick: bool) -> Figures:
    reader = rig.reader()
    rows: list[dict[str, Any]] = []
    for name, translator in translators(rig).items():
        log = rig.out / f"kernels-{name}.txt"
        log.unlink(missing_ok=True)
        # where arbiter keeps a job's control document: the translator writes nowhere else
        control = rig.out / "jobs" / f"gt-{name}" / "control.json"
        control.parent.mkdir(parents=True, exist_ok=True)
        write_control_document(str(control), "run", 1.0, 1)
        cooperative = name == "control_doc"
        env = {"ARBITER_CONTROL": str(control)} if cooperative else {}
        args = ["queue", "--kernel-ms", "50", "--inflight", "4", "--seconds", "60", "--log", str(log)]
        proc, info = rig.work(*args, *(["--cooperative"] if cooperative else []), env=env)
        pid = info["pid"]
        target = JobTarget(f"gt-{name}", name, (ref_of(pid),), str(control), cooperative)
        time.sleep(1.0 if quick else 2.0)
        held_before = (reader.read([pid]).processes.get(pid) or _none()).vram_bytes
        how = ""
        if name == "cgroup_freeze":
            how = "own cgroup frozen" if translator.own_cgroup(target) else "no cgroup of its own: signals"  # type: ignore[attr-defined]
        paused_at = time.monotonic()
        if cooperative:
            translator.control(target, ControlUpdate("paused", 0.0, "gpu_truth"), 2)
        else:
            translator.pause(target)
        call_s = time.monotonic() - paused_at
        zero_at: float | None = None
        watch_end = time.monotonic() + (3.0 if quick else 4.0)
        while time.monotonic() < watch_end:
            util = rig.utilization()
            now = time.monotonic()
            if util > 0:
                zero_at = None
            elif zero_at is None:
                zero_at = now
            time.sleep(0.02)
        done = [t for t in completions(log) if t > paused_at]
        held = (reader.read([pid]).processes.get(pid) or _none()).vram_bytes
        effect = translator.pause_effect([target.processes[0]]) if not cooperative else translator.pause_effect([])
        if name == "cuda_checkpoint":
            how = "checkpointed" if "VRAM released" in effect else effect
        resumed_at = time.monotonic()
        if cooperative:
            translator.control(target, ControlUpdate("run", 1.0, "gpu_truth"), 3)
        else:
            translator.resume(list(target.processes))
        resume_s = time.monotonic() - resumed_at
        again = _first_after(log, resumed_at, 10.0)
        if name == "cuda_checkpoint":
            translator.kill(target)  # checkpointed again first: it was restored
        else:
            proc.kill()
        proc.wait(30)
        rows.append(
            {
                "translator": name,
                "how": how,
                "pause_call_s": round(call_s, 4),
                "kernels_after_pause": len(done),
                "last_kernel_s": round(max(done) - paused_at, 4) if done else 0.0,
                "nvml_zero_s": None if zero_at is None else round(zero_at - paused_at, 4),
                "vram_before": held_before,
                "vram_paused": held,
                "resume_call_s": round(resume_s, 4),
                "first_kernel_after_resume_s": None if again is None else round(again - resumed_at, 4),
            }
        )
    reader.close()
    lines = [
        "| pause by | pause call | kernels done after it | last one at | NVML util 0 at | VRAM before → paused | resume call → first kernel |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['translator']}{' (' + r['how'] + ')' if r['how'] else ''} | {1000 * r['pause_call_s']:.1f} ms | "
            f"{r['kernels_after_pause']} | {1000 * r['last_kernel_s']:.0f} ms | "
            f"{_ms(r['nvml_zero_s'], 'never')} | "
            f"{_gib(r['vram_before'])} → {_gib(r['vram_paused'])} | {1000 * r['resume_call_s']:.1f} ms → "
            f"{_ms(r['first_kernel_after_resume_s'], 'none')} |"
            for r in rows
        ),
    ]
    return {"rows": rows, "lines": lines}


def _none() -> Any:
    from arbiter.plugin import ProcessGpu

    return ProcessGpu(vram_bytes=0)


def _ms(seconds: float | None, otherwise: str) -> str:
    return otherwise if seconds is None else f"{1000 * seconds:.0f} ms"


def _gib(n: int | None) -> str:
    return "unreadable" if n is None else f"{n / GIB:.2f} GiB"


def _first_after(log: Path, since: float, timeout_s: float) -> float | None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        after = [t for t in completions(log) if t > since]
        if after:
            return min(after)
        time.sleep(0.02)
    return None


# --- a pause that frees VRAM ---------------------------------------------------------------------


def part_checkpoint(rig: Rig, quick: bool, gib: float) -> Figures:
    from arbiter_translators import CudaCheckpointTranslator

    steps = "60" if quick else "200"
    common = ["train", "--steps", steps, "--seed", "7", "--hold-gib", str(gib), "--step-ms", "10"]
    plain = rig.out / "losses-plain.txt"
    proc, _ = rig.work(*common, "--losses", str(plain))
    proc.wait(600)
    paused_run = rig.out / "losses-paused.txt"
    translator = CudaCheckpointTranslator(
        CudaCheckpointTranslator.Options(backend="driver" if rig.dry else "auto", library=rig.library), rig.context()
    )
    ok, why = translator.available()
    reader = rig.reader()
    proc, info = rig.work(*common, "--losses", str(paused_run))
    pid = info["pid"]
    _wait(lambda: len(completions_lines(paused_run)) >= int(steps) // 3, 120, "a third of the steps")
    target = JobTarget("gt-train", "train", (ref_of(pid),))
    before, free_before = (reader.read([pid]).processes.get(pid) or _none()).vram_bytes, rig.free_bytes()
    started = time.monotonic()
    translator.pause(target)
    checkpoint_s = time.monotonic() - started
    time.sleep(1.0)
    after, free_after = (reader.read([pid]).processes.get(pid) or _none()).vram_bytes, rig.free_bytes()
    effect = translator.pause_effect(list(target.processes))
    started = time.monotonic()
    translator.resume(list(target.processes))
    restore_s = time.monotonic() - started
    back = (reader.read([pid]).processes.get(pid) or _none()).vram_bytes
    proc.wait(600)
    reader.close()
    same = plain.read_text() == paused_run.read_text() and bool(plain.read_text())
    figures: Figures = {
        "available": why,
        "held_gib": gib,
        "vram_before": before,
        "vram_paused": after,
        "vram_after_restore": back,
        "device_freed": free_after - free_before,
        "checkpoint_s": round(checkpoint_s, 3),
        "restore_s": round(restore_s, 3),
        "losses_bitwise_equal": same,
        "steps": int(steps),
        "effect": effect,
    }
    figures["lines"] = [
        f"cuda_checkpoint: {why}",
        f"job holding {gib:g} GiB: VRAM {_gib(before)} → {_gib(after)} while paused → {_gib(back)} after restore; "
        f"the device's free VRAM grew by {(free_after - free_before) / GIB:.2f} GiB",
        f"checkpoint (lock + copy-out + stop) {checkpoint_s:.2f}s, restore (continue + copy-in + unlock) {restore_s:.2f}s",
        f"{steps} training steps' losses bitwise equal to an unpaused run with the same seed: {'yes' if same else 'NO'}",
        f"explain says: {effect}",
    ]
    if not ok:
        figures["lines"].insert(0, "cuda_checkpoint is not available here")
    return figures


def completions_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout_s:g}s for {what}")
        time.sleep(0.05)


# --- the run ------------------------------------------------------------------------------------


def load(results: Path, device: dict[str, str]) -> dict[str, Any]:
    """What earlier runs measured on this same device (a run on another is put aside)."""
    try:
        doc: dict[str, Any] = json.loads(results.read_text())
    except (OSError, ValueError):
        return {"device": device, "parts": {}}
    if doc.get("device", {}).get("gpu") != device["gpu"] or doc.get("device", {}).get("driver") != device["driver"]:
        aside = results.with_name(f"results-{int(time.time())}.json")
        results.rename(aside)
        print(f"results of another device or driver put aside as {aside}")
        return {"device": device, "parts": {}}
    return doc


def report(doc: dict[str, Any]) -> str:
    d = doc["device"]
    head = f"# GPU truth: {d['gpu']}, driver {d['driver']}, {d['memory_gib']} GiB" + (
        " (DRY RUN: stand-ins, not a GPU)" if d.get("dry_run") == "True" else ""
    )
    out = [head, ""]
    for name in PARTS:
        part = doc["parts"].get(name)
        if part is None:
            out += [f"## {name}", "", "not run yet", ""]
            continue
        out += [f"## {name} ({part['seconds']:.0f}s, {part['at']})", "", *part["figures"]["lines"], ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which, of {', '.join(PARTS)}")
    ap.add_argument("--redo", action="store_true", help="run parts again that are done")
    ap.add_argument("--dry-run", action="store_true", help="fakes of NVML and the driver, a CPU core for the GPU")
    ap.add_argument("--quick", action="store_true", help="fewer levels, shorter windows (always on with --dry-run)")
    ap.add_argument("--gib", type=float, default=8.0, help="what the checkpointed job and the model server hold")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: a temporary one for a dry run, else bench/out/gpu_truth)",
    )
    ap.add_argument("--apply-profile", metavar="RULE", help="refused: this script never changes device settings")
    args = ap.parse_args(argv)
    if args.apply_profile:
        raise Refused(
            f"refusing --apply-profile {args.apply_profile}: this script never changes the GPU's settings (power "
            "limit, clocks, compute mode, MIG, persistence); the gpu_profile translator is tested against a fake "
            "NVML only"
        )
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="gpu-truth-dry-")) if args.dry_run else ROOT / "bench" / "out" / "gpu_truth"
    )
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick or args.dry_run
    gib = min(args.gib, 2.0) if args.dry_run else args.gib
    rig = Rig(out, args.dry_run)
    results = out / "results.json"
    doc = load(results, rig.device())
    print(f"device: {doc['device']}; results in {out}", flush=True)
    failed: list[str] = []
    try:
        for name in wanted:
            if name in doc["parts"] and not args.redo:
                print(f"{name}: done at {doc['parts'][name]['at']}, kept (--redo runs it again)", flush=True)
                continue
            print(f"{name}: running", flush=True)
            started = time.monotonic()
            try:
                figures = run_part(name, rig, quick, gib)
            except Exception as exc:  # the other parts still run; this one is tried again next time
                failed.append(name)
                print(
                    f"{name}: FAILED after {time.monotonic() - started:.0f}s: {type(exc).__name__}: {exc}", flush=True
                )
                continue
            doc["parts"][name] = {
                "figures": figures,
                "seconds": time.monotonic() - started,
                "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            }
            results.write_text(json.dumps(doc, indent=1, default=str))  # each part kept as soon as it is done
            print("\n".join(figures["lines"]), flush=True)
    finally:
        rig.close()
    text = report(doc)
    (out / "report.md").write_text(text + "\n")
    print("\n" + text)
    if failed:
        print(f"\nfailed: {', '.join(failed)} (run the same command again to retry only what is not done)")
    return 1 if failed else 0


def run_part(name: str, rig: Rig, quick: bool, gib: float) -> Figures:
    rig.forget_the_dead()
    if name == "readers":
        return part_readers(rig, quick)
    if name == "pause":
        return part_pause(rig, quick)
    if name == "checkpoint":
        return part_checkpoint(rig, quick, gib)
    from gpu_truth_daemon import part_handoff, part_protected

    if name == "handoff":
        return part_handoff(rig, quick, gib)
    return part_protected(rig, quick)


if __name__ == "__main__":
    sys.exit(main())
