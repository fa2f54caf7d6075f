"""What the daemon costs the machine it runs on: idle, through a desktop day, and under load.

    uv run python bench/cost.py [--scenario idle|desktop|load|all] [--seconds 60] [--rounds 2]
    uv run python bench/cost.py --calls [--check]

Live figures, each scenario a daemon of its own, measured ``--rounds`` times in a row (their
spread is the box's noise: it is shared, so only the daemon's own process tree is counted,
in CPU time read from ``/proc``, never in wall time):

- **idle**: about 300 processes on the host, the shipped rule files and one protected
  program with a JSONL phase source (ten rules), no job, the default tick;
- **desktop**: the same with three jobs and the protected program's phase turned on and off
  every ``--phase-every`` seconds;
- **load**: ``bench/load.py``'s fleet node (a thousand processes, a hundred rules, fifty
  jobs, a writer appending ten thousand JSONL lines a second), its half-second tick.

For each: the CPU of the daemon and every process under it (its reflex process, its child
workers) per minute of wall time and as a share of one core; their wake-ups a second (the
voluntary and involuntary context switches of every thread, from ``/proc/PID/task/*/status``),
the threads that wake most; RSS and PSS (``smaps_rollup``, each shared page counted once);
and under load the tick thread's CPU per tick (``status`` costs) beside the whole tree's.

``--calls`` prints the deterministic figures instead: the Python function calls of the two
hot paths (one tick over a fixed process table, decided; one phase line read until the
translator's pause), counted with a profile hook on every thread, so they do not move with
the box.  ``--check`` compares them with ``bench/cost_budget.json`` and fails when either is
more than :data:`BUDGET_SLACK` times its budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_RULES = ROOT / "tenants.d"
BUDGET = Path(__file__).with_name("cost_budget.json")
#: a figure over its budget by more than this factor fails ``--check``: a change that doubles
#: a hot path's work fails, the odd extra call does not
BUDGET_SLACK = 1.5
GOAL_IDLE_CORE_PCT = 0.2
GOAL_IDLE_WAKEUPS = 5.0
GOAL_LOAD_TICK_MS = 5.0
GOAL_LOAD_DAEMON_MS = 10.0
SETTLE_S = 10.0  # after start-up and after the load is in place, before a window opens
IDLE_PROCESSES = 300
PROTECTED_MARKER = "cost-bench-protected"


# --- reading /proc --------------------------------------------------------------------------


def tree(root: int) -> list[int]:
    """``root`` and every process under it, now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_s(pid: int) -> float:
    """utime + stime of the whole process (every thread), in seconds."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pid: int) -> dict[str, int]:
    """Each thread's context switches (voluntary + involuntary), keyed ``pid/tid name``."""
    out: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", "rb") as fh:
                status = fh.read().decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        count = int(fields.get("voluntary_ctxt_switches", 0)) + int(fields.get("nonvoluntary_ctxt_switches", 0))
        out[f"{pid}/{tid} {fields.get('Name', '').strip()}"] = count
    return out


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            rows = dict(line.split(":", 1) for line in fh if ":" in line and not line.startswith(" "))
    except OSError:
        return 0, 0

    def kib(key: str) -> int:
        value = rows.get(key, "0 kB").split()
        return int(value[0]) if value and value[0].isdigit() else 0

    return kib("Rss"), kib("Pss")


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    for marker in ("arbiter.reflex.process", "arbiter run", "_procscan", "childwork"):
        if marker in text:
            return marker
    return text[:60]


@dataclass
class Sample:
    at: float
    cpu: dict[int, float]
    ctx: dict[str, int]
    names: dict[int, str] = field(default_factory=dict)


def sample(root: int) -> Sample:
    pids = tree(root)
    ctx: dict[str, int] = {}
    for pid in pids:
        ctx.update(switches(pid))
    return Sample(time.monotonic(), {p: cpu_s(p) for p in pids}, ctx, {p: process_name(p) for p in pids})


@dataclass
class Window:
    seconds: float
    cpu_s: float
    wakeups: int
    by_thread: list[tuple[str, int]]
    by_process: dict[str, float]
    rss_kib: int
    pss_kib: int

    @property
    def core_pct(self) -> float:
        return 100 * self.cpu_s / self.seconds

    @property
    def cpu_ms_per_min(self) -> float:
        return 1000 * 60 * self.cpu_s / self.seconds

    @property
    def wakeups_s(self) -> float:
        return self.wakeups / self.seconds


def window(before: Sample, after: Sample) -> Window:
    """What the tree spent between two samples; a process that came or went in between
    counts what it spent while seen."""
    by_process: dict[str, float] = {}
    for pid, cpu in after.cpu.items():
        spent = cpu - before.cpu.get(pid, 0.0)  # one started inside the window counts whole
        name = after.names.get(pid, "?")
        by_process[name] = by_process.get(name, 0.0) + spent
    by_thread = sorted(
        ((key, count - before.ctx.get(key, 0)) for key, count in after.ctx.items()), key=lambda kv: -kv[1]
    )
    rss = pss = 0
    for pid in after.cpu:
        r, p = memory_kib(pid)
        rss, pss = rss + r, pss + p
    return Window(
        after.at - before.at,
        sum(by_process.values()),
        sum(c for _, c in by_thread),
        by_thread[:6],
        by_process,
        rss,
        pss,
    )


# --- the scenarios ---------------------------------------------------------------------------


def top_up(processes: int) -> list[subprocess.Popen[bytes]]:
    """Idle ``sleep`` processes until the host has about ``processes``."""
    have = sum(1 for e in os.listdir("/proc") if e.isdigit())
    return [subprocess.Popen(["sleep", "86400"], start_new_session=True) for _ in range(max(0, processes - have))]


def desktop_node(root: Path, jobs: int) -> tuple[Any, Path, list[subprocess.Popen[bytes]]]:
    """A node with the shipped rules and one protected program under a JSONL phase source,
    ``jobs`` idle jobs; started."""
    from arbiter_testing.node import HarnessNode
    from arbiter_testing.rules import phase_rule

    phases = root / "phases.jsonl"
    phases.touch()
    node = HarnessNode(root, tick_s=2.0)
    for rule in sorted(SHIPPED_RULES.glob("*.yaml")):
        shutil.copy(rule, node.tenants / rule.name)
        os.chmod(node.tenants / rule.name, 0o644)  # rules that send requests are taken only from safe files
    node.add_rule("protected", phase_rule("protected", PROTECTED_MARKER, phases, scope="all", priority=90))
    node.start()
    extra = [node.spawn([sys.executable, "-c", "import time; time.sleep(86400)", PROTECTED_MARKER])]
    for k in range(jobs):
        node.job_run(["sleep", str(86400 + k)], "--name", f"cost-job-{k}", stderr=subprocess.DEVNULL)
    node.wait_for(lambda: sum(1 for j in node.status()["jobs"] if j["pids"]) >= jobs, timeout=60)
    node.wait_for(lambda: node.known_rule("protected")["running"], timeout=60)
    return node, phases, extra


def write_phase(phases: Path, phase: str) -> None:
    with open(phases, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": phase}) + "\n")


def measure(node: Any, seconds: float, rounds: int, phases: Path | None, phase_every: float) -> list[Window]:
    daemon = node.daemon.pid
    out = []
    flips = 0
    for _ in range(rounds):
        before = sample(daemon)
        end = before.at + seconds
        next_flip = before.at + phase_every / 2
        while (now := time.monotonic()) < end:
            if phases is not None and now >= next_flip:
                flips += 1
                write_phase(phases, "on" if flips % 2 else "off")
                next_flip += phase_every
            time.sleep(max(0.0, min(end, next_flip if phases is not None else end) - time.monotonic()))
        out.append(window(before, sample(daemon)))
    if phases is not None and flips % 2:
        write_phase(phases, "off")
    return out


def show(label: str, windows: list[Window], goals: bool) -> None:
    print(f"\n== {label} ==")
    for i, w in enumerate(windows):
        print(
            f"  round {i + 1}: {w.seconds:.0f}s  CPU {w.cpu_ms_per_min:.0f} ms/min ({w.core_pct:.2f} % of a core)"
            f"{f'  goal <= {GOAL_IDLE_CORE_PCT:g} %' if goals else ''};  wake-ups {w.wakeups_s:.1f}/s"
            f"{f'  goal <= {GOAL_IDLE_WAKEUPS:g}/s' if goals else ''};  RSS {w.rss_kib / 1024:.0f} MiB, "
            f"PSS {w.pss_kib / 1024:.0f} MiB"
        )
        print("    CPU by process: " + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in w.by_process.items()))
        print("    most wake-ups: " + ", ".join(f"{k} {c / w.seconds:.1f}/s" for k, c in w.by_thread))


def scenario_node(args: argparse.Namespace, jobs: int, phase_every: float | None, label: str) -> None:
    root = Path(tempfile.mkdtemp(prefix=f"arbiter-cost-{label}-"))
    sleepers = top_up(args.processes)
    node = None
    try:
        node, phases, _ = desktop_node(root, jobs)
        time.sleep(SETTLE_S)
        windows = measure(node, args.seconds, args.rounds, phases if phase_every else None, phase_every or 0.0)
        status = node.status()
        show(f"{label}: {status['processes']} processes, {len(status['rules'])} rules, {jobs} jobs", windows, True)
    finally:
        if node is not None:
            node.close()
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def scenario_load(args: argparse.Namespace) -> None:
    """bench/load.py's load, without its fast-path measurements."""
    sys.path.insert(0, str(ROOT / "bench"))
    import load

    from arbiter_testing.node import HarnessNode

    root = Path(tempfile.mkdtemp(prefix="arbiter-cost-load-"))
    phases, stream, report = root / "phases.jsonl", root / "stream.jsonl", root / "writer.json"
    phases.touch()
    stream.touch()
    node = HarnessNode(root, tick_s=0.5, governor={"period_s": load.GOVERNOR_PERIOD_S})
    procs: list[subprocess.Popen[bytes]] = []
    rules, jobs, groups = 100, 50, 60
    try:
        load.add_tenants(node, phases, stream)
        node.start()
        for tenant in ("4999", "4998"):
            node.spawn(["sleep", tenant])
        for i in range(1000):
            procs.append(subprocess.Popen(["sleep", str(5000 + i % groups)], start_new_session=True))
        load.load_rules(node, root, rules, groups)
        for k in range(jobs):
            node.job_run(["sleep", str(3000 + k)], "--name", f"load-job-{k}", stderr=subprocess.DEVNULL)
        node.wait_for(lambda: sum(1 for j in node.status()["jobs"] if j["pids"]) >= jobs, timeout=600, every=0.5)
        node.wait_for(lambda: len(node.status()["rules"]) == rules + 2, timeout=60, every=0.5)
        procs.append(subprocess.Popen([sys.executable, "-c", load.WRITER, str(stream), "10000", str(report)]))
        time.sleep(SETTLE_S)
        assert node.daemon is not None
        for i in range(args.rounds):
            ticks0, cpu0 = load.tick_costs(node)
            before = sample(node.daemon.pid)
            time.sleep(args.seconds)
            w = window(before, sample(node.daemon.pid))
            ticks1, cpu1 = load.tick_costs(node)
            ticks = max(ticks1 - ticks0, 1)
            show(f"load round {i + 1}: {node.status()['processes']} processes", [w], False)
            print(
                f"    tick thread {(cpu1 - cpu0) / ticks:.2f} ms CPU a tick (goal <= {GOAL_LOAD_TICK_MS:g});"
                f" whole tree {1000 * w.cpu_s / ticks:.2f} ms a tick (goal <= {GOAL_LOAD_DAEMON_MS:g}); {ticks} ticks"
            )
    finally:
        node.close()
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


# --- the deterministic figures ---------------------------------------------------------------


def calls() -> dict[str, int]:
    """The two hot paths' Python function calls (see :mod:`costcalls` beside this file)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import costcalls

    return costcalls.figures()


def over_budget(figures: dict[str, int], budget: dict[str, int]) -> list[str]:
    """The figures over their budget by more than :data:`BUDGET_SLACK`, said."""
    return [
        f"{name}: {figures[name]} calls, over {BUDGET_SLACK:g} x its budget of {budget[name]} ({BUDGET.name})"
        for name in budget
        if figures[name] > BUDGET_SLACK * budget[name]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["idle", "desktop", "load", "all"], default="all")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=IDLE_PROCESSES)
    parser.add_argument("--phase-every", type=float, default=10.0)
    parser.add_argument("--calls", action="store_true", help="the deterministic figures only")
    parser.add_argument("--check", action="store_true", help="with --calls: fail when over the budget")
    args = parser.parse_args(argv)
    if args.calls:
        figures = calls()
        budget = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
        for name, count in figures.items():
            print(f"{name}: {count} Python calls (budget {budget.get(name, '-')})")
        over = over_budget(figures, budget) if args.check else []
        for line in over:
            print("OVER " + line)
        return 1 if over else 0
    if args.scenario in ("idle", "all"):
        scenario_node(args, 0, None, "idle")
    if args.scenario in ("desktop", "all"):
        scenario_node(args, 3, args.phase_every, "desktop")
    if args.scenario in ("load", "all"):
        scenario_load(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
