"""The daemon under load: many processes, rules and jobs, and a JSONL source written fast.

    uv run python bench/load.py [--processes 1000] [--rules 100] [--jobs 50] [--lines 10000] [--seconds 20]

One daemon, measured twice in the same run.  First bare: one protected stand-in (``sleep``)
under an ``immediate`` rule whose phase is read from a JSONL file, and one job under ``arbiter
job run``, the probe; the bench appends phase lines and polls the probe's process until it is
stopped (or continued), as bench/reaction_latency.py does.  The probe spends 5 % of a core,
its GPU time under the stand-in reader, so under load it is the job taking the most GPU time,
the one a phase pauses first (the others are idle: among equals the order was chance, and
put the probe among the last fifty in one pause in twenty).  Then the load is added:
``--processes`` idle processes (``sleep``, a tenth of them in each of ten command-line
groups per ten rules), ``--rules`` rule files of several kinds (most match some of them; a
few match nothing; some protect by GPU share, some have a phase source of their own, some
have only a kind and a priority), ``--jobs`` jobs under ``arbiter job run`` and a writer
subprocess appending ``--lines`` JSONL step lines a second to a protected rule's source.
Under that load it measures the tick's CPU time (``status`` costs, over the window: the tick
thread's own CPU time plus that of the plugin calls it hands to pool threads and to child
workers, so the source watchers' work beside it is not counted; the whole process's CPU is
printed too, and its reflex process's), the daemon's RSS (psutil, the peak; and with its
reflex process and child workers, the RSS together and their PSS, which counts each shared
page once), the rate the daemon counts against the
rate the writer achieved, and the fast path again.  Beside each fast-path figure, its floor:
the bench signals a process of its own (from a process of its own, as the daemon's reflex
process signals) and polls it the same way, with no daemon in the path, so what the load
costs any process on the box shows apart from what it costs the daemon; and once more under
load with as many idle processes as the load has jobs signalled right after it, so what the
jobs' own wake-ups cost shows apart too.  Beside the p99's change, a bootstrap interval says
how sure that change is (the p99 of a few hundred reactions on a shared box moves by
milliseconds between two runs of the same code).

The goal, the fast path's p99 unchanged by the load, is judged on the daemon's part of it:
each p99 less its floor's, bare and under load, the change between the two given as a
bootstrap interval (all four samples resampled).  It is met when all of that interval is
within a millisecond, missed when none of it is, undecided otherwise (``--changes 2000``,
about half an hour, narrows it to about a millisecond).  The whole path's change is printed
too, with its own interval: on a two-core box this load moves the floor, a signal from one
idle process to another with no daemon in it, by one to two milliseconds at p99, so the
whole path's change says what the box did as much as what the daemon did.  Every figure is
printed beside its goal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from arbiter_testing.node import HarnessNode
from arbiter_testing.reaction import difference_interval, ms_until_seen, phase_reactions
from arbiter_testing.reaction import percentile as pct
from arbiter_testing.rules import phase_during, phase_rule

GOAL_TICK_MS = 50.0
GOAL_RSS_MIB = 100.0
REFLEX_MODULE = "arbiter.reflex.process"  # the daemon's reflex process runs it
GOAL_LAG = 0.02  # the counted rate within 2 % of the written one
GOAL_FAST_MS = 1.0  # "unchanged by the load": the daemon's part of the p99 moves by less than a millisecond
FAST = "fast"
STREAM = "stream"
GOVERNOR_PERIOD_S = 5.0  # the window the daemon counts rates over
POLL_S = 0.0002  # a light poll: the box has two cores and the daemon needs one
#: signals a process (argv 1) at each line, and with "1" after it the others (argv 2) too,
#: as the daemon does: a pause waits for the first to stop (a millisecond at most)
SIGNALLER = """\
import os, signal, sys, time
first, others = int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",") if p]
def stopped(pid):
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return data[data.rfind(b")") + 2:][:1] == b"T"
for line in sys.stdin:
    stopping, burst = line.split()
    sig = signal.SIGSTOP if stopping == "1" else signal.SIGCONT
    os.kill(first, sig)
    if burst == "1":
        end = time.monotonic() + 0.001
        while stopping == "1" and not stopped(first) and time.monotonic() < end:
            time.sleep(0.00005)
        for pid in others:
            os.kill(pid, sig)
"""
#: the probe job: half a millisecond of CPU time in every ten
PROBE = """\
import time
while True:
    end = time.perf_counter() + 0.0005
    while time.perf_counter() < end:
        pass
    time.sleep(0.0095)
"""

WRITER = """\
import json, os, sys, time
path, rate, report = sys.argv[1], float(sys.argv[2]), sys.argv[3]
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
start = time.monotonic()
written = 0
last_report = 0.0
while True:
    now = time.monotonic()
    due = int((now - start) * rate) - written
    if due > 0:
        line = b'{"event": "step_done", "step": 0}\\n'
        os.write(fd, line * due)
        written += due
    if now - last_report >= 0.25:
        tmp = report + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(json.dumps({"t": now, "lines": written}))
        os.replace(tmp, report)
        last_report = now
    time.sleep(0.005)
"""


def fast_path(node: HarnessNode, phases: Path, pid: int, changes: int, seed: int) -> list[float]:
    """Phase written → the job's process seen stopped (or continued), in ms."""
    try:
        return phase_reactions(phases, pid, changes, random.Random(seed), poll_s=POLL_S)
    except RuntimeError as exc:
        try:
            seen = json.dumps(
                {
                    "rule": node.known_rule(FAST),
                    "job": next(j for j in node.status()["jobs"] if pid in j["pids"]),
                },
                default=str,
            )[:4000]
        except Exception as why:
            seen = f"(no status: {why})"
        raise RuntimeError(f"{exc}\n{seen}\n{node.log()}") from None


def signal_floor(
    signaller: subprocess.Popen[str], pid: int, changes: int, seed: int, burst: bool = False
) -> list[float]:
    """The bench's own signal, sent by :data:`SIGNALLER` → the process seen stopped (or
    continued), in ms, polled as :func:`fast_path` polls: the part of the fast-path figure
    that is the box (the target's wake-up, the poller's turn on a core), not the daemon.
    With ``burst``, the signaller's other processes are signalled right after, in the
    daemon's order."""
    assert signaller.stdin is not None
    proc, rng, out = psutil.Process(pid), random.Random(seed), []
    for i in range(changes):
        time.sleep(rng.uniform(0.02, 0.05))
        stopping = i % 2 == 0
        started = time.monotonic()
        signaller.stdin.write(f"{int(stopping)} {int(burst)}\n")
        signaller.stdin.flush()
        out.append(ms_until_seen(proc, stopping, started, POLL_S))
    signaller.stdin.write(f"0 {int(burst)}\n")  # left running
    signaller.stdin.flush()
    return out


def fast_verdict(lo: float, hi: float) -> str:
    """The fast-path goal judged on the p99's change as an interval, not one draw of it: the
    p99 of 400 reactions on this box moves by milliseconds between runs of the same code, so
    a single figure passed one run and failed the next.  Only a slower p99 counts against
    it: one faster under load harms nothing."""
    if hi <= GOAL_FAST_MS:
        return "ok"
    if lo > GOAL_FAST_MS:
        return "OVER"
    return f"UNDECIDED (the interval below holds {GOAL_FAST_MS:g} ms: more --changes narrow it)"


def add_tenants(node: HarnessNode, phases: Path, stream: Path) -> None:
    """The two measured tenants: ``FAST`` (an immediate phase rule on ``phases``, run by
    ``sleep 4999``) and ``STREAM`` (a progress rule on ``stream``, run by ``sleep 4998``)."""
    node.add_rule(FAST, phase_rule(FAST, "sleep 4999", phases, scope="all", priority=90))
    node.add_rule(
        STREAM,
        {
            "id": STREAM,
            "match": {"cmdline": ["sleep 4998"]},
            "priority": 80,
            "protect": {
                "metric": "progress_rate",
                "source": {"kind": "jsonl", "path": str(stream), "event": "step_done"},
            },
        },
    )


def load_rules(node: HarnessNode, root: Path, rules: int, groups: int) -> None:
    """``rules`` rule files; rule j < groups matches the j-th command-line group."""
    for j in range(rules):
        match = {"cmdline": [f"sleep {5000 + j}"]} if j < groups else {"cmdline": [f"no-such-program-{j}"]}
        rule: dict[str, Any] = {"id": f"load-{j:03d}", "priority": j % 20, "match": match}
        shape = j % 4
        if shape == 0:
            rule["protect"] = {"metric": "gpu_share"}
        elif shape == 1 and j % 8 == 1:  # a phase source of its own (a watch each), never written
            quiet = root / f"quiet-{j}.jsonl"
            quiet.touch()
            rule["during"] = [phase_during(quiet)]
        else:
            rule["kind"] = ("trainer", "desktop", "other", "diffusion")[j % 4]
        node.add_rule(f"load-{j:03d}", rule)


def sample_rss(pid: int, stop: threading.Event, peak: list[float]) -> None:
    """The peaks of the daemon's RSS (``peak[0]``) and of its processes' together: the daemon,
    its reflex process and its child workers (``peak[1]``, RSS, so shared pages count twice)."""
    proc = psutil.Process(pid)
    while not stop.wait(0.2):
        try:
            own = proc.memory_info().rss
            peak[0] = max(peak[0], own / 2**20)
            peak[1] = max(peak[1], (own + sum(rss(child) for child in proc.children())) / 2**20)
        except psutil.NoSuchProcess:
            return


def rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def pss_mib(procs: list[psutil.Process]) -> float:
    """Their proportional set size together: each shared page counted once, split between
    the processes that map it (what they cost the host's memory together)."""
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.Error, AttributeError):
            continue
    return total / 2**20


def written(report: Path) -> tuple[float, int]:
    data = json.loads(report.read_text())
    return float(data["t"]), int(data["lines"])


def counted_rate(node: HarnessNode) -> float | None:
    rule = node.known_rule(STREAM)
    rate = rule["sources"][0]["rate"] if rule["sources"] else None
    return None if rate is None else float(rate)


def helper_cpu_s(daemon: psutil.Process, module: str | None = None) -> float:
    """CPU seconds so far of the daemon's child workers (the process table's scan, the
    reader's reads), as the OS counts them: a check of what the children report, which the
    tick's own figure includes.  ``module``: of its process running that module instead."""
    spent = 0.0
    for child in daemon.children():
        try:
            if (
                any(arg.endswith("childwork.py") for arg in child.cmdline())
                if module is None
                else module in child.cmdline()
            ):
                times = child.cpu_times()
                spent += times.user + times.system
        except psutil.Error:
            continue
    return spent


def tick_costs(node: HarnessNode) -> tuple[int, float]:
    costs = node.status()["costs"]
    return int(costs["ticks"]), float(costs["tick_cpu_ms"] or 0.0) * int(costs["ticks"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--rules", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument(
        "--lines", type=float, default=10_000, help="JSONL lines a second written to a protected source"
    )
    parser.add_argument("--seconds", type=float, default=20, help="the measuring window under load")
    parser.add_argument(
        "--changes",
        type=int,
        default=400,
        help="phase changes per fast-path measurement (the p99 of 400 leaves the four slowest out: "
        "of 200, two slow wake-ups on this shared box decided it)",
    )
    parser.add_argument("--tick", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--reflex-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act on phase changes in the reflex process (the default) or inside the daemon",
    )
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="arbiter-bench-load-"))
    phases, stream, report = root / "phases.jsonl", root / "stream.jsonl", root / "writer.json"
    phases.touch()
    stream.touch()
    node = HarnessNode(
        root, tick_s=args.tick, governor={"period_s": GOVERNOR_PERIOD_S}, reflex_process=args.reflex_process
    )
    sleepers: list[subprocess.Popen[bytes]] = []
    bystanders: list[subprocess.Popen[bytes]] = []
    writer: subprocess.Popen[bytes] | None = None
    control: subprocess.Popen[bytes] | None = None
    signaller: subprocess.Popen[str] | None = None
    stop = threading.Event()
    peak = [0.0, 0.0]
    groups = max(1, min(args.rules, (args.rules * 6) // 10))  # six rules in ten match a group
    try:
        add_tenants(node, phases, stream)
        node.start()
        daemon = psutil.Process(node.daemon.pid)  # type: ignore[union-attr]
        for tenant in ("4999", "4998"):
            node.spawn(["sleep", tenant])
        node.job_run([sys.executable, "-c", PROBE], "--name", "probe", stderr=subprocess.DEVNULL)
        pid = node.job_pid("probe", timeout=30)
        node.wait_for(lambda: node.known_rule(FAST)["running"], timeout=30)
        rss_bare = daemon.memory_info().rss / 2**20
        bare = fast_path(node, phases, pid, args.changes, args.seed)
        control = subprocess.Popen(["sleep", "3998"])  # no rule matches it: only the bench signals it
        # as many idle processes as the load has jobs, matched by no rule: the floor with a burst
        bystanders = [subprocess.Popen(["sleep", "3997"]) for _ in range(args.jobs)]
        signaller = subprocess.Popen(
            [sys.executable, "-c", SIGNALLER, str(control.pid), ",".join(str(b.pid) for b in bystanders)],
            stdin=subprocess.PIPE,
            text=True,
        )
        floor_bare = signal_floor(signaller, control.pid, args.changes, args.seed)
        bare_status = node.status()
        bare_daemon = next(r for r in bare_status["rules"] if r["id"] == FAST)["sources"][0]["latency"]
        bare_process = bare_status["fast_path"].get("reflex_process")

        # --- the load ------------------------------------------------------------------------
        started = time.monotonic()
        for i in range(args.processes):
            sleepers.append(subprocess.Popen(["sleep", str(5000 + i % groups)], start_new_session=True))
        load_rules(node, root, args.rules, groups)
        errs = root / "launchers.err"
        with open(errs, "ab") as err:
            for k in range(args.jobs):
                node.job_run(["sleep", str(3000 + k)], "--name", f"load-job-{k}", stderr=err)
        try:
            node.wait_for(
                lambda: sum(1 for j in node.status()["jobs"] if j["pids"]) >= args.jobs + 1, timeout=180, every=0.5
            )
        except TimeoutError:
            jobs = node.status()["jobs"]
            raise RuntimeError(
                f"{sum(1 for j in jobs if j['pids'])} of {args.jobs + 1} jobs started; the rest: "
                f"{[(j['name'], j['state'], [r['message'] for r in j['reasons']]) for j in jobs if not j['pids']][:3]}"
                f"\nthe launchers said:\n{errs.read_text()[-3000:]}\n{node.log()}"
            ) from None
        node.wait_for(lambda: len(node.status()["rules"]) == args.rules + 2, timeout=60, every=0.5)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(stream), str(args.lines), str(report)])
        node.wait_for(report.exists, timeout=30)
        set_up_s = time.monotonic() - started
        time.sleep(GOVERNOR_PERIOD_S + 2 * args.tick)  # the counted rate's window is all under load
        sampler = threading.Thread(target=sample_rss, args=(daemon.pid, stop, peak), daemon=True)
        sampler.start()

        t0, lines0 = written(report)
        ticks0, cpu0 = tick_costs(node)
        proc0, helper0, reflex0 = daemon.cpu_times(), helper_cpu_s(daemon), helper_cpu_s(daemon, REFLEX_MODULE)
        counted: list[float] = []
        wrote: list[float] = []
        deadline = time.monotonic() + args.seconds
        prev = written(report)
        while time.monotonic() < deadline:
            time.sleep(GOVERNOR_PERIOD_S / 2)
            rate = counted_rate(node)
            now = written(report)
            if rate is not None:
                counted.append(rate)
            wrote.append((now[1] - prev[1]) / max(now[0] - prev[0], 1e-9))
            prev = now
        t1, lines1 = written(report)
        ticks1, cpu1 = tick_costs(node)
        proc1, helper1, reflex1 = daemon.cpu_times(), helper_cpu_s(daemon), helper_cpu_s(daemon, REFLEX_MODULE)
        loaded = fast_path(node, phases, pid, args.changes, args.seed + 1)
        floor_loaded = signal_floor(signaller, control.pid, args.changes, args.seed + 1)
        floor_burst = signal_floor(signaller, control.pid, args.changes, args.seed + 2, burst=True)
        t2, lines2 = written(report)
        status = node.status()
        faults = [e["message"] for e in node.call("timeline", code="PLUGIN_FAILED", limit=1000)["events"]]
        given_up = [line for line in node.log().splitlines() if "child worker was given up" in line]
        loaded_daemon = next(r for r in status["rules"] if r["id"] == FAST)["sources"][0]["latency"]
        stop.set()
        sampler.join(2)
        rss_end = daemon.memory_info().rss / 2**20
        peak[0] = max(peak[0], rss_end)
        family = [daemon, *daemon.children()]
        reflex_rss = sum(rss(p) for p in family if REFLEX_MODULE in p.cmdline()) / 2**20
        pss_end = pss_mib(family)
    finally:
        stop.set()
        helpers: list[subprocess.Popen[Any] | None] = [writer, control, signaller, *bystanders]
        for helper in helpers:
            if helper is not None:
                helper.kill()
                helper.wait()
        try:  # the jobs' own processes: a launcher killed mid-wait may leave its command behind
            job_pids = [pid for j in node.status()["jobs"] for pid in j["pids"]]
        except Exception:
            job_pids = []
        node.close()
        for pid in job_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for s in sleepers:
            s.kill()
        for s in sleepers:
            s.wait()
        shutil.rmtree(root, ignore_errors=True)

    ticks = ticks1 - ticks0
    helper_ms = 1000 * (helper1 - helper0) / max(ticks, 1)
    reflex_ms = 1000 * (reflex1 - reflex0) / max(ticks, 1)
    tick_ms = (cpu1 - cpu0) / max(ticks, 1)
    proc_cpu = (proc1.user + proc1.system) - (proc0.user + proc0.system)
    write_rate = (lines1 - lines0) / max(t1 - t0, 1e-9)
    write_rate_fast = (lines2 - lines1) / max(t2 - t1, 1e-9)
    count_rate = sum(counted) / len(counted) if counted else float("nan")
    lag = (write_rate - count_rate) / write_rate if write_rate else float("nan")
    p99_bare, p99_loaded = pct(bare, 0.99), pct(loaded, 0.99)

    def mark(ok: bool) -> str:
        return "ok" if ok else "OVER"

    print(
        f"load: {status['processes']} processes on the host, {len(status['rules'])} rules, {len(status['jobs'])} jobs, "
        f"tick {args.tick:g}s; set up in {set_up_s:.0f}s, measured over {t1 - t0:.1f}s"
    )
    print(
        f"tick CPU per tick (scan, match, read: the tick thread's CPU, what its plugin calls spent on pool "
        f"threads, and its child workers'; not the source watchers'), mean over {ticks} ticks: "
        f"{tick_ms:.2f} ms   goal < {GOAL_TICK_MS:g} ms  {mark(tick_ms < GOAL_TICK_MS)}"
    )
    print(
        f"  its child workers, as the OS counts them: {helper_ms:.2f} ms a tick (the figure above has what they report)"
    )
    print(
        f"  last scan wall time {status['scan_ms']} ms; decision CPU per decision (since start) "
        f"{status['costs']['decide_cpu_ms']} ms over {status['costs']['decisions']} decisions"
    )
    print(
        f"  whole daemon process CPU: {1000 * proc_cpu / max(ticks, 1):.2f} ms per tick "
        f"({100 * proc_cpu / max(t1 - t0, 1e-9):.1f}% of one core); its reflex process: {reflex_ms:.2f} ms per tick"
    )
    print(
        f"daemon RSS: bare {rss_bare:.1f} MiB, peak under load {peak[0]:.1f} MiB"
        f"   goal < {GOAL_RSS_MIB:g} MiB  {mark(peak[0] < GOAL_RSS_MIB)}"
    )
    print(
        f"  with its reflex process ({reflex_rss:.1f} MiB RSS at the end) and child workers: RSS together peak"
        f" {peak[1]:.1f} MiB (shared pages counted in each); PSS together at the end {pss_end:.1f} MiB"
        f" (each shared page once)   {mark(pss_end < GOAL_RSS_MIB)} against the same goal"
    )
    print(
        f"JSONL writer: {write_rate:.0f} lines/s achieved over the window (asked {args.lines:g}), "
        f"{write_rate_fast:.0f} lines/s during the loaded fast-path run; per sample "
        f"{min(wrote):.0f}..{max(wrote):.0f}"
        if wrote
        else "JSONL writer: no samples"
    )
    print(
        f"counted rate (status, {GOVERNOR_PERIOD_S:g}s window): mean {count_rate:.0f} lines/s over {len(counted)} samples"
        f" ({min(counted) if counted else float('nan'):.0f}..{max(counted) if counted else float('nan'):.0f});"
        f" lag {100 * lag:+.2f} %   goal within {100 * GOAL_LAG:g} %  {mark(abs(lag) <= GOAL_LAG)}"
    )
    print(
        f"plugin failures on the timeline (a late process table among them): {len(faults)}"
        + "".join(f"\n  {m[:160]}" for m in faults[:5])
    )
    print(
        f"child workers given up (their work then done in the daemon): {len(given_up)}"
        + "".join(f"\n  {m[:200]}" for m in given_up[:3])
    )
    lo, hi = difference_interval(bare, loaded, 0.99, random.Random(args.seed))
    floor_p99_bare, floor_p99_loaded = pct(floor_bare, 0.99), pct(floor_loaded, 0.99)
    print(
        f"fast path, write -> job stopped/continued: bare p50 {pct(bare, 0.5):.2f} ms, p90 {pct(bare, 0.9):.2f} ms,"
        f" p99 {p99_bare:.2f} ms; under load p50 {pct(loaded, 0.5):.2f} ms, p90 {pct(loaded, 0.9):.2f} ms,"
        f" p99 {p99_loaded:.2f} ms ({len(loaded)} changes each); p99 {p99_loaded - p99_bare:+.2f} ms under load,"
        f" 95 % bootstrap interval {lo:+.2f} .. {hi:+.2f} ms"
        f" ({'it holds 0: the change may be sampling noise' if lo <= 0 <= hi else 'it does not hold 0: the load changed it'})"
    )
    print(
        f"  the floor, the bench's own signal -> seen stopped/continued: bare p50 {pct(floor_bare, 0.5):.2f} ms,"
        f" p99 {floor_p99_bare:.2f} ms; under load p50 {pct(floor_loaded, 0.5):.2f} ms,"
        f" p99 {floor_p99_loaded:.2f} ms, {floor_p99_loaded - floor_p99_bare:+.2f} ms (no daemon in it: what the load"
        f" costs any process on this box)"
    )
    print(
        f"  the floor with {args.jobs} more signals after each (under load, to {args.jobs} idle processes of the bench's,"
        f" a pause's once the first has stopped, as the daemon sends them): p50 {pct(floor_burst, 0.5):.2f} ms,"
        f" p99 {pct(floor_burst, 0.99):.2f} ms; of which pauses p99 {pct(floor_burst[0::2], 0.99):.2f} ms,"
        f" resumes p99 {pct(floor_burst[1::2], 0.99):.2f} ms (what the load's jobs' own wake-ups cost any observer)"
    )
    over_bare, over_loaded = p99_bare - floor_p99_bare, p99_loaded - floor_p99_loaded
    lo_over, hi_over = difference_interval(
        bare, loaded, 0.99, random.Random(args.seed), floors=(floor_bare, floor_loaded)
    )
    print(
        f"fast path, the daemon's part (each p99 less its floor's): bare {over_bare:+.2f} ms, under load"
        f" {over_loaded:+.2f} ms; {over_loaded - over_bare:+.2f} ms under load   goal: unchanged (within"
        f" {GOAL_FAST_MS:g} ms)  {fast_verdict(lo_over, hi_over)}"
    )
    print(
        f"  its change, 95 % bootstrap interval (all four samples resampled): {lo_over:+.2f} .. {hi_over:+.2f} ms;"
        f" {'it holds 0: the change may be sampling noise' if lo_over <= 0 <= hi_over else 'it does not hold 0: the load changed it'}"
    )
    for what, start in (("pauses (phase on)", 0), ("resumes (phase off)", 1)):
        some_bare, some_loaded = bare[start::2], loaded[start::2]  # the changes alternate, on first
        print(
            f"  {what} alone: bare p50 {pct(some_bare, 0.5):.2f} ms, p99 {pct(some_bare, 0.99):.2f} ms;"
            f" under load p50 {pct(some_loaded, 0.5):.2f} ms,"
            f" p99 {pct(some_loaded, 0.99):.2f} ms"
        )
    print(
        f"  the source's figure in status (write seen -> decided and signalled): bare p50 {bare_daemon['p50_ms']} ms,"
        f" p99 {bare_daemon['p99_ms']} ms; with the load p50 {loaded_daemon['p50_ms']} ms, p99 {loaded_daemon['p99_ms']} ms"
        f" (over all {loaded_daemon['count']} changes)"
    )
    process = status["fast_path"].get("reflex_process")
    if process:
        print(
            f"  the reflex process (pid {process['pid']}, {process['sources']} sources): acted on {process['armed']} changes,"
            f" left {process['not_armed']} to the daemon (not armed yet); reading -> lock taken p50"
            f" {process['locked']['p50_ms']} ms, p99 {process['locked']['p99_ms']} ms; -> the first job signalled p50"
            f" {process['first']['p50_ms']} ms, p99 {process['first']['p99_ms']} ms; -> all {args.jobs + 1} signalled p50"
            f" {process['acted']['p50_ms']} ms, p99 {process['acted']['p99_ms']} ms"
        )
        if bare_process:
            print(
                f"    bare (one job), reading -> the job signalled: p50 {bare_process['first']['p50_ms']} ms,"
                f" p99 {bare_process['first']['p99_ms']} ms (the figures above are over the last"
                f" {process['first']['count']} readings, {max(0, process['first']['count'] - len(loaded))} of them bare)"
            )
    for role, did in status["fast_path"]["threads"].items():  # sorted by role
        print(f"  fast-path thread {role}: {did}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
