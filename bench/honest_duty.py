"""An honest job is never struck: SDK jobs at duties 0.1…0.9 beside a saturated core, read by
every ``cpu_time`` configuration, judged by the compliance rule the daemon applies.

    uv run python bench/honest_duty.py [--minutes 30] [--duties 0.1,...] [--no-hog] [--sdk DIR] [--json]

A hog process spins on one core for the whole run.  For each duty in turn, one job (a child
process) holds that duty with ``arbiter.sdk.Duty(device="cpu")``, its units 2 to 20 ms of
CPU work; every ``compliance.sample_s`` (2 s) each reader configuration reads the job's
processes and the share read is fed to :func:`arbiter.engine.compliance.check` with the
default policy (over duty + 0.1 for 3 samples: a strike).  The duties (``--duties``, default
0.1 to 0.9) share ``--minutes`` equally.  Then a cheater, which says it holds 0.3 and spins
flat out, is read the same way until it is struck.

It prints, per duty and reader: samples, mean and highest share read, and strikes; the
cheater's samples until its strike; and the figures the goals are judged on.  Goals: 0
strikes for the honest jobs over the whole run; the cheater struck within 3 samples.
``--sdk DIR``: the jobs import the SDK from a copy of ``arbiter/sdk`` in DIR (another
release, vendored), to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiter.engine import codes
from arbiter.engine.compliance import check
from arbiter.engine.types import CompliancePolicy, JobCompliance, JobObs, NameTrust
from arbiter.engine.usage import busy_share
from arbiter.plugin import GpuReading, PluginContext, Reader
from arbiter_readers import CpuTimeReader

DUTIES = [round(0.1 * i, 1) for i in range(1, 10)]
#: every configuration of the stand-in reader the node config offers
READERS: dict[str, dict[str, Any]] = {"cpu_time": {}, "cpu_time threads": {"threads": True}}
CHEATER_ASKED = 0.3
CHEATER_SAMPLES = 10  # read this many at most

HONEST_JOB = """
import random, sys, time
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
from {module} import Duty

rng = random.Random(7)
duty = Duty(device="cpu")
duty.set(float(sys.argv[1]))
while True:
    unit = rng.choice((0.002, 0.005, 0.02))
    with duty.unit():
        end = time.thread_time() + unit
        while time.thread_time() < end:
            pass
"""
CHEATER = "while True: pass\n"
HOG = "while True: pass\n"


@dataclass
class Cell:
    """One job read by one reader configuration."""

    reader: str
    asked: float
    shares: list[float] = field(default_factory=list)
    strikes: int = 0
    first_strike_sample: int | None = None
    jc: JobCompliance = field(default_factory=JobCompliance)
    trust: NameTrust = field(default_factory=NameTrust)

    def take(self, share: float, now: float, cp: CompliancePolicy) -> None:
        self.shares.append(share)
        job = JobObs("bench", "bench", os.getuid(), started=True, measured=share, measured_at=now)
        verdict = check(job, self.asked, True, False, self.jc, self.trust, cp, 0.05, now)
        self.jc, self.trust = verdict.state, verdict.trust
        struck = [e for e in verdict.events if e.code in (codes.GPU_DUTY_EXCEEDED, codes.JOB_UNTRUSTED)]
        if struck:
            self.strikes += len(struck)
            if self.first_strike_sample is None:
                self.first_strike_sample = len(self.shares)
            # the daemon pauses it 60 s now; the bench goes on reading, as from a fresh start
            self.jc = JobCompliance(asked=self.asked, asked_since=now)

    def row(self) -> dict[str, Any]:
        n = len(self.shares)
        return {
            "reader": self.reader,
            "asked": self.asked,
            "samples": n,
            "mean": round(sum(self.shares) / n, 4) if n else None,
            "max": round(max(self.shares), 4) if n else None,
            "strikes": self.strikes,
            "first_strike_sample": self.first_strike_sample,
            "over_before_strike": sum(
                1 for x in self.shares[: self.first_strike_sample or n] if x > self.asked + CompliancePolicy().tolerance
            ),
        }


def make_readers(state_dir: Path) -> dict[str, Reader]:
    context = PluginContext(state_dir=state_dir, stand_in_gpu=True)
    return {name: CpuTimeReader(CpuTimeReader.Options(**opts), context) for name, opts in READERS.items()}


def tree(pid: int) -> list[int]:
    """The job and its children (a job is a process tree to the daemon)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            kids = []
        todo.extend(int(k) for k in kids)
    return out


def watch(
    proc: subprocess.Popen[bytes],
    cells: dict[str, Cell],
    readers: dict[str, Reader],
    seconds: float,
    cp: CompliancePolicy,
    until_struck: bool = False,
) -> None:
    """Read the job every sample until ``seconds`` have passed (or, with ``until_struck``,
    until every reader struck it, or ``CHEATER_SAMPLES``)."""
    pids = tree(proc.pid)
    last: dict[str, GpuReading] = {name: r.read(pids) for name, r in readers.items()}
    started = time.monotonic()
    next_at = started + cp.sample_s
    while True:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += cp.sample_s
        now = time.monotonic()
        pids = tree(proc.pid)
        for name, reader in readers.items():
            reading = reader.read(pids)
            before = last[name]
            share = busy_share(
                {p: g.busy_ns for p, g in before.processes.items()},
                before.at_ns,
                {p: g.busy_ns for p, g in reading.processes.items()},
                reading.at_ns,
                pids,
            )
            last[name] = reading
            if share is not None:
                cells[name].take(share, now, cp)
        if until_struck:
            if all(c.strikes for c in cells.values()) or all(len(c.shares) >= CHEATER_SAMPLES for c in cells.values()):
                return
        elif now - started >= seconds:
            return


def run_job(
    argv: list[str], asked: float, seconds: float, readers: dict[str, Reader], until_struck: bool
) -> dict[str, Cell]:
    cp = CompliancePolicy()
    cells = {
        name: Cell(name, asked, jc=JobCompliance(asked=asked, asked_since=time.monotonic() - cp.sample_s))
        for name in readers
    }
    proc = subprocess.Popen(argv)
    try:
        watch(proc, cells, readers, seconds, cp, until_struck)
    finally:
        proc.kill()
        proc.wait()
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="the honest jobs' time in all")
    parser.add_argument(
        "--duties",
        type=lambda text: [float(d) for d in text.split(",")],
        default=DUTIES,
        help="the honest jobs' duties, comma-separated (default 0.1 to 0.9 by 0.1)",
    )
    parser.add_argument("--no-hog", action="store_true", help="leave the other core alone")
    parser.add_argument("--sdk", help="a folder holding a copy of arbiter/sdk as arbiter_sdk/")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    module = "arbiter_sdk" if args.sdk else "arbiter.sdk"
    job = HONEST_JOB.format(module=module)
    per_duty = args.minutes * 60 / len(args.duties)
    hog = None if args.no_hog else subprocess.Popen([sys.executable, "-c", HOG])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="arbiter-bench-") as tmp:
        readers = make_readers(Path(tmp))
        try:
            for d in args.duties:
                argv = [sys.executable, "-c", job, str(d)] + ([args.sdk] if args.sdk else [])
                cells = run_job(argv, d, per_duty, readers, until_struck=False)
                rows.extend(c.row() | {"job": "honest"} for c in cells.values())
                if not args.json:
                    for c in cells.values():
                        r = c.row()
                        print(
                            f"honest  duty {d:.1f}  {r['reader']:<17} samples {r['samples']:>4}  "
                            f"mean {r['mean']:.3f}  max {r['max']:.3f}  strikes {r['strikes']}",
                            flush=True,
                        )
            cells = run_job([sys.executable, "-c", CHEATER], CHEATER_ASKED, 0, readers, until_struck=True)
            rows.extend(c.row() | {"job": "cheater"} for c in cells.values())
        finally:
            for reader in readers.values():
                reader.close()
            if hog is not None:
                hog.kill()
                hog.wait()
    honest = [r for r in rows if r["job"] == "honest"]
    cheats = [r for r in rows if r["job"] == "cheater"]
    summary = {
        "hog": not args.no_hog,
        "minutes": args.minutes,
        "honest_strikes": sum(r["strikes"] for r in honest),
        "honest_samples": sum(r["samples"] for r in honest),
        "worst_over_asked": round(max(r["max"] - r["asked"] for r in honest), 4),
        "cheater_struck_at_sample": {r["reader"]: r["first_strike_sample"] for r in cheats},
        "rows": rows,
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    for r in cheats:
        print(
            f"cheater asked {r['asked']:.1f}  {r['reader']:<17} samples {r['samples']:>4}  mean {r['mean']:.3f}  "
            f"struck at sample {r['first_strike_sample']} ({r['over_before_strike']} of them over {r['asked'] + 0.1:.1f})"
        )
    print(
        f"honest jobs: {summary['honest_strikes']} strikes in {summary['honest_samples']} samples "
        f"({args.minutes:g} min per reader); highest share over its duty: {summary['worst_over_asked']:+.3f} "
        "(a strike needs over +0.100 three samples in a row)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
