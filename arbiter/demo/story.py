"""``arbiter demo``: a protected program and fleet jobs sharing one (stand-in) GPU.

Everything is real: a daemon process, a protected stand-in found by its command line, jobs
started through ``arbiter job run``, a phase written to a JSONL file.  A CPU core stands in
for the GPU (``stand_in_gpu: true`` and the ``cpu_time`` reader).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from arbiter.api.ops import Op
from arbiter.cli.render import console as plain_console
from arbiter.cli.render import jobs_table, print_explain, print_timeline, rules_table
from arbiter.demo.node import PYTHON, LocalNode
from arbiter.harness.report import text as report_text
from arbiter.transport import RequestRefused

RULE_ID = "standin-trainer"


def standin_rule(events: Path) -> dict[str, Any]:
    return {
        "id": RULE_ID,
        "kind": "trainer",
        "priority": 50,
        "match": {"cmdline": ["arbiter.demo.protected"]},
        "immediate": True,
        "protect": {
            "metric": "progress_rate",
            "max_slowdown": 0.05,
            "source": {"kind": "jsonl", "path": str(events), "event": "step_done"},
        },
        "during": [
            {
                "source": {
                    "kind": "jsonl",
                    "path": str(events),
                    "event": "status",
                    "field": "state.phase",
                    "on": ["uploading"],
                    "soon": ["preparing_upload"],
                },
                "pause_fleet": {"scope": "gpu"},
                "tags": ["uplink"],
            }
        ],
        "notes": "the demo's protected stand-in: a CPU core stands in for the GPU",
    }


class _Rate:
    """The protected program's steps per second, counted from its own event file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.samples: deque[tuple[float, int]] = deque(maxlen=8)

    def __call__(self) -> float | None:
        try:
            with open(self.path, "rb") as fh:
                count = sum(1 for line in fh if b'"step_done"' in line)
        except FileNotFoundError:
            return None
        self.samples.append((time.monotonic(), count))
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


def _view(node: LocalNode, step: str, rate: _Rate) -> Group:
    status = node.status()
    r = rate()
    head = Text()
    head.append(f"{step}\n", style="bold magenta")
    head.append(f"protected program: {'-' if r is None else f'{r:.0f} steps/s'}   ")
    head.append(
        f"gpu_jobs: {status['gpu_jobs']}   reader: {status['reader']['name'] or 'none'} (CPU stands in for the GPU)"
    )
    head.append(f"\n$ arbiter duty → {node.call('duty')['duty']['summary']}")
    run = next((r for r in node.call(Op.AB_STATUS)["runs"] if r["status"] == "running"), None)
    if run is not None:
        window = (run.get("live") or {}).get("window") or {}
        head.append(
            f"\n$ arbiter ab status → run {run['run']}: block {run['blocks_done']}/{run['target']}"
            + (f", {window['arm'].upper()} window" if window else "")
            + f", {run['excluded']} left out"
        )
    return Group(Panel.fit(head), rules_table(status["rules"]), jobs_table(status["jobs"]))


def _show(live: Live, node: LocalNode, step: str, rate: _Rate, seconds: float, until: Any = None) -> None:
    """A step: on a terminal, its view redrawn in place; into a file or a log, where a redraw
    would keep only the last step, the view as the step ends, printed below the steps before."""
    on_terminal = live.console.is_terminal
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if on_terminal:
            live.update(_view(node, step, rate))
        if until is not None and until():
            # on a terminal the view stays a moment, to be read; a file keeps it anyway
            deadline = min(deadline, time.monotonic() + (1.5 if on_terminal else 0.0))
            until = None
        time.sleep(0.25)
    if not on_terminal:
        live.console.print(_view(node, step, rate))


def _state(node: LocalNode, name: str) -> str:
    job = node.job(name)
    return job["state"] if job else ""


def _governor(node: LocalNode) -> str:
    rules = node.call(Op.DUTY)["duty"]["rules"]
    return str(rules[0]["state"]) if rules else ""


#: a short paired run (a real one takes hours: 12 blocks of 5-minute windows)
DEMO_RUN = {
    "work": "batch-coop",
    "duty": 0.2,
    "blocks": 4,
    "window": 2.5,
    "washout": 0.5,
    "margin": 0.1,
    "max_hours": 0.05,
}


def _run_state(node: LocalNode, run_id: str) -> dict[str, Any]:
    return next((r for r in node.call(Op.AB_STATUS)["runs"] if r["run"] == run_id), {})


def _append(path: Path, record: dict[str, Any]) -> float:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return time.monotonic()


def run_demo(keep: bool = False, console: Console | None = None) -> int:
    console = console or plain_console()
    root = Path(tempfile.mkdtemp(prefix="arbiter-demo-"))
    events = root / "trainer-events.jsonl"
    idle_flag = root / "protected.idle"
    events.touch()
    slow = root / "protected.slow"
    node = LocalNode(
        root,
        tick_s=1,
        gpu_release_after_s=3,
        gpu_jobs="certified",
        governor={"period_s": 2, "baseline_s": 2, "rebaseline_s": 600, "take_back_s": 4, "grow_step": 0.05},
    )
    node.add_rule("standin", standin_rule(events))
    started = time.monotonic()
    try:
        console.print(
            Panel.fit(
                "arbiter demo: one core stands in for the GPU.\n"
                f"state in {root}\n"
                "A protected stand-in and two fleet jobs will contend for it; arbiter keeps the protected one unharmed.",
                title="arbiter demo",
            )
        )
        node.start()
        rate = _Rate(events)
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            with open(root / "jobs.log", "ab") as jobs_log:  # the job keeps its own copy
                node.job_run(
                    [PYTHON, "-m", "arbiter.demo.job"],
                    "--cooperative",
                    "--name",
                    "batch-coop",
                    stderr=jobs_log,
                )
            _show(
                live,
                node,
                "1. A cooperative job is admitted: nothing protected uses the GPU",
                rate,
                8,
                lambda: _state(node, "batch-coop") == "run",
            )
            protected = node.spawn(
                [
                    PYTHON,
                    "-m",
                    "arbiter.demo.protected",
                    "--events",
                    str(events),
                    "--idle-flag",
                    str(idle_flag),
                    "--step-s",
                    "0.01",
                    "--gap-s",
                    "0.01",
                    "--slow-file",
                    str(slow),
                ]
            )
            _show(
                live,
                node,
                "2. The protected program starts working: the job is paused through its control document",
                rate,
                8,
                lambda: _state(node, "batch-coop") == "paused",
            )
            idle_flag.touch()
            _show(
                live,
                node,
                "3. The protected program goes idle: after gpu_release_after_s the job resumes",
                rate,
                10,
                lambda: _state(node, "batch-coop") == "run",
            )
            with open(root / "jobs.log", "ab") as jobs_log:
                node.job_run(
                    [PYTHON, "-m", "arbiter.demo.job", "--plain"],
                    "--name",
                    "batch-plain",
                    stderr=jobs_log,
                )
            _show(
                live,
                node,
                "4. A job that cannot cooperate is admitted too",
                rate,
                6,
                lambda: _state(node, "batch-plain") == "run",
            )
            _append(events, {"t": time.time(), "event": "status", "state": {"phase": "uploading"}})
            _show(
                live,
                node,
                "5. The protected program enters its 'uploading' phase: GPU work pauses at once",
                rate,
                4,
                lambda: _state(node, "batch-plain") == "paused",
            )
            explain = node.call(Op.EXPLAIN, subject="batch-plain")["explain"]
            fast = node.status()["fast_path"]
            _append(events, {"t": time.time(), "event": "status", "state": {"phase": "done"}})
            _show(
                live,
                node,
                "6. The phase ends: both jobs resume",
                rate,
                4,
                lambda: _state(node, "batch-plain") == "run" and _state(node, "batch-coop") == "run",
            )
            idle_flag.unlink()
            node.wait_for(lambda: node.status()["rules"][0]["sources"][0]["rate"], timeout=10)
            run_id = node.call(Op.AB_START, rule=RULE_ID, **DEMO_RUN)["plan"]["run"]
            _show(
                live,
                node,
                f"7. Prove it: a paired ON/OFF run ({run_id}) holds the job in random OFF windows and runs it "
                f"at duty {DEMO_RUN['duty']} in ON windows; the job that cannot throttle waits",
                rate,
                60,
                lambda: _run_state(node, run_id).get("status") not in (None, "running"),
            )
            ran, aborted = _run_state(node, run_id), False
            if ran.get("status") == "running":
                # undecided within the demo's minute (a noisy machine, or windows left out): the
                # run ends here, and says so, rather than being shown as a verdict
                with contextlib.suppress(RequestRefused):  # it may have ended just now
                    node.call(Op.AB_ABORT, id=run_id)
                    aborted = True
            proof = node.call(Op.AB_SHOW, id=run_id)["report"]
            certified = proof["certifies"]
            why = (
                f"still undecided after {ran['blocks_done']} of its {ran['target']} blocks "
                f"({ran['excluded']} left out) when the demo's minute ran out: it was aborted"
                if aborted
                else proof["verdict"] or proof["why"] or proof["status"]
            )
            _show(
                live,
                node,
                (
                    "8. The run shows no slowdown beyond the margin: its certificate lets the governor run the "
                    "cooperative job beside the program, after a baseline"
                )
                if certified
                else f"8. The run earned no certificate ({why}): GPU work keeps waiting (GPU_NOT_CERTIFIED)",
                rate,
                14,
                lambda: not certified or (_governor(node) == "running" and _state(node, "batch-coop") == "run"),
            )
            if certified:
                slow.write_text("1.0")
                _show(
                    live,
                    node,
                    "9. The protected program slows down: the budget is taken back at once",
                    rate,
                    10,
                    lambda: _governor(node) == "taken back",
                )
                slow.write_text("0")
                _show(
                    live,
                    node,
                    "10. It keeps up again: after take_back_s the budget comes back",
                    rate,
                    12,
                    lambda: _governor(node) == "running" and _state(node, "batch-coop") == "run",
                )
            idle_flag.touch()
        phase_events = node.call(Op.TIMELINE, code="PROTECTION_PHASE_ON", limit=5)["events"]
        latency = next((e["data"].get("latency_ms") for e in reversed(phase_events) if "latency_ms" in e["data"]), None)
        console.print(
            Panel.fit(
                f"phase write → jobs paused: {latency if latency is not None else '?'} ms after the watcher read it "
                f"(fast path p50 {fast['p50_ms']} ms, p99 {fast['p99_ms']} ms over {fast['count']} change(s))",
                title="reaction",
            )
        )
        console.print(Text("$ arbiter explain batch-plain   (while the phase was on)", style="bold"))
        print_explain(console, explain)
        console.print(Text(f"\n$ arbiter ab show {run_id}", style="bold"))
        console.print(report_text(proof), markup=False, highlight=False)
        console.print(Text("\n$ arbiter timeline", style="bold"))
        print_timeline(console, node.call(Op.TIMELINE, limit=25)["events"])
        protected.terminate()
        console.print(f"demo finished in {time.monotonic() - started:.0f}s; nothing is left running.")
        return 0
    except Exception as exc:
        console.print(Text(f"the demo failed: {type(exc).__name__}: {exc}", style="red"))
        console.print(Text(node.log()))
        return 1
    finally:
        node.close()
        if keep:
            console.print(f"state kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
