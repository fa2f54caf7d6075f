"""``arbiter demo``: a protected program and fleet jobs sharing one (stand-in) GPU.

Everything is real: a daemon process, a protected stand-in found by its command line, jobs
started through ``arbiter job run``, a phase written to a JSONL file.  A CPU core stands in
for the GPU (``stand_in_gpu: true`` and the ``cpu_time`` reader).  Everything a run uses is
its own: a temporary folder (state, socket, runtime pointer, events file), a free HTTP port,
and a rule that selects the stand-in this run started, so that runs side by side, and the
tests' stand-ins, leave each other alone.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from arbiter.api.ops import Op
from arbiter.api.transport import RequestRefused
from arbiter.cli.render import console as plain_console
from arbiter.cli.render import jobs_table, print_explain, print_timeline, rules_table
from arbiter.demo.node import PYTHON, LocalNode

RULE_ID = "standin-trainer"


def standin_marker(events: Path) -> str:
    """What the rule looks for in the stand-in's command line: the module and this run's own
    events file, which lies in the run's private folder.  The module alone would also select
    the stand-ins of another demo, a test or a daemon beside this one, anywhere on the host."""
    return f"arbiter.demo.protected --events {events}"


def standin_rule(events: Path) -> dict[str, Any]:
    return {
        "id": RULE_ID,
        "kind": "trainer",
        "priority": 50,
        "match": {"cmdline": [standin_marker(events)]},
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
        "notes": "the demo's protected stand-in, the one this run started: a CPU core stands in for the GPU",
    }


class Rate:
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


def _view(node: LocalNode, step: str, rate: Rate, proof: bool = False) -> Group:
    status = node.status()
    r = rate()
    head = Text()
    head.append(f"{step}\n", style="bold magenta")
    head.append(f"protected program: {'-' if r is None else f'{r:.0f} steps/s'}   ")
    head.append(
        f"gpu_jobs: {status['gpu_jobs']}   reader: {status['reader']['name'] or 'none'} (CPU stands in for the GPU)"
    )
    if proof:  # the budget and the run matter only to the proof
        head.append(f"\n$ arbiter duty → {node.call(Op.DUTY)['duty']['summary']}")
        run = next((r for r in node.call(Op.AB_STATUS)["runs"] if r["status"] == "running"), None)
        if run is not None:
            window = (run.get("live") or {}).get("window") or {}
            head.append(
                f"\n$ arbiter ab status → run {run['run']}: block {run['blocks_done']}/{run['target']}"
                + (f", {window['arm'].upper()} window" if window else "")
                + f", {run['excluded']} left out"
            )
    return Group(Panel.fit(head), rules_table(status["rules"]), jobs_table(status["jobs"]))


def show(
    live: Live, node: LocalNode, step: str, rate: Rate, seconds: float, until: Any = None, proof: bool = False
) -> bool:
    """A step: on a terminal, its view redrawn in place; into a file or a log, where a redraw
    would keep only the last step, the view as the step ends, printed below the steps before.
    Whether ``until`` came to hold within ``seconds``."""
    on_terminal = live.console.is_terminal
    deadline = time.monotonic() + seconds
    met = until is None
    while time.monotonic() < deadline:
        if on_terminal:
            live.update(_view(node, step, rate, proof))
        if not met and until():
            met = True
            # on a terminal the view stays a moment, to be read; a file keeps it anyway
            deadline = min(deadline, time.monotonic() + (1.0 if on_terminal else 0.0))
            continue
        time.sleep(0.25 if on_terminal else 0.1)
    if not on_terminal:
        live.console.print(_view(node, step, rate, proof))
    return met


def state_of(node: LocalNode, name: str) -> str:
    job = node.job(name)
    return job["state"] if job else ""


def _append(path: Path, record: dict[str, Any]) -> float:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return time.monotonic()


#: what the story's timeline shows: the events of the story, not every reading
STORY_CODES = (
    "JOB_ADMITTED",
    "JOB_PAUSED",
    "JOB_RESUMED",
    "PROTECTION_PHASE_ON",
    "PROTECTION_PHASE_OFF",
    "PROTECTED_GPU_BUSY",
    "PROTECTED_GPU_IDLE",
)


@contextlib.contextmanager
def demo_node(keep: bool, console: Console, gpu_jobs: str, title: str) -> Iterator[tuple[LocalNode, Path, Path]]:
    root = Path(tempfile.mkdtemp(prefix="arbiter-demo-"))
    events = root / "trainer-events.jsonl"
    events.touch()
    node = LocalNode(
        root,
        tick_s=0.5,
        gpu_release_after_s=2,
        gpu_jobs=gpu_jobs,
        governor={"period_s": 2, "baseline_s": 2, "rebaseline_s": 600, "take_back_s": 4, "grow_step": 0.05},
    )
    node.add_rule("standin", standin_rule(events))
    console.print(Panel.fit(f"{title}\nstate in {root}", title="arbiter demo"))
    try:
        node.start()
        yield node, root, events
    finally:
        node.close()
        if keep:
            console.print(f"state kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def start_protected(node: LocalNode, root: Path, events: Path) -> Any:
    return node.spawn(
        [
            PYTHON,
            "-m",
            "arbiter.demo.protected",  # with the events path next: what standin_marker says
            "--events",
            str(events),
            "--idle-flag",
            str(root / "protected.idle"),
            "--step-s",
            "0.01",
            "--gap-s",
            "0.01",
            "--slow-file",
            str(root / "protected.slow"),
        ]
    )


def start_job(node: LocalNode, root: Path, name: str, *options: str) -> None:
    with open(root / "jobs.log", "ab") as jobs_log:  # the job keeps its own copy
        node.job_run(
            [PYTHON, "-m", "arbiter.demo.job", *(["--plain"] if "--cooperative" not in options else [])],
            *options,
            "--name",
            name,
            stderr=jobs_log,
        )


class DemoFailed(Exception):
    """A step of the story did not happen within its time."""


def must_show(live: Live, node: LocalNode, step: str, rate: Rate, seconds: float, until: Callable[[], bool]) -> None:
    if not show(live, node, step, rate, seconds, until):
        raise DemoFailed(f"{step.split(':')[0]}: did not happen within {seconds:g}s")


def run_demo(keep: bool = False, console: Console | None = None) -> int:
    """The story: a job admitted, held while the protected program works, paused within
    milliseconds on a phase, resumed; then ``explain`` and the timeline of those events."""
    console = console or plain_console()
    started = time.monotonic()
    title = (
        "One core stands in for the GPU. A protected stand-in and two fleet jobs contend for it;\n"
        "arbiter keeps the protected one unharmed."
    )
    try:
        with demo_node(keep, console, "when_no_gpu_protected", title) as (node, root, events):
            idle_flag = root / "protected.idle"
            rate = Rate(events)
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                start_job(node, root, "batch-coop", "--cooperative")
                must_show(
                    live,
                    node,
                    "1. A cooperative job is admitted: nothing protected uses the GPU",
                    rate,
                    45,
                    lambda: state_of(node, "batch-coop") == "run",
                )
                protected = start_protected(node, root, events)
                must_show(
                    live,
                    node,
                    "2. The protected program starts working: the job is held (paused through its control document)",
                    rate,
                    45,
                    lambda: state_of(node, "batch-coop") == "paused",
                )
                idle_flag.touch()
                must_show(
                    live,
                    node,
                    "3. The protected program goes idle: after gpu_release_after_s the job resumes",
                    rate,
                    45,
                    lambda: state_of(node, "batch-coop") == "run",
                )
                start_job(node, root, "batch-plain")
                must_show(
                    live,
                    node,
                    "4. A job that cannot cooperate is admitted too",
                    rate,
                    45,
                    lambda: state_of(node, "batch-plain") == "run",
                )
                _append(events, {"t": time.time(), "event": "status", "state": {"phase": "uploading"}})
                must_show(
                    live,
                    node,
                    "5. The protected program enters its 'uploading' phase: GPU work pauses at once",
                    rate,
                    45,
                    lambda: state_of(node, "batch-plain") == "paused" and state_of(node, "batch-coop") == "paused",
                )
                explain = node.call(Op.EXPLAIN, subject="batch-plain")["explain"]
                fast = node.status()["fast_path"]
                _append(events, {"t": time.time(), "event": "status", "state": {"phase": "done"}})
                must_show(
                    live,
                    node,
                    "6. The phase ends: both jobs resume",
                    rate,
                    45,
                    lambda: state_of(node, "batch-plain") == "run" and state_of(node, "batch-coop") == "run",
                )
            _reaction(console, node, fast)
            console.print(Text("$ arbiter explain batch-plain   (while the phase was on)", style="bold"))
            print_explain(console, explain)
            console.print(Text("\n$ arbiter timeline", style="bold"))
            story = [e for e in node.call(Op.TIMELINE, limit=200)["events"] if e["code"] in STORY_CODES]
            print_timeline(console, story[-20:])
            protected.terminate()
        console.print(
            Text(
                f"done in {time.monotonic() - started:.0f}s: the job was admitted, held while the protected program "
                "worked, paused on its phase and resumed; nothing is left running.\n"
                "Next: `arbiter demo --proof` measures what the work costs the program (a paired run, about a minute and a half).",
                style="bold green",
            )
        )
        return 0
    except (DemoFailed, TimeoutError, RuntimeError, RequestRefused) as exc:
        console.print(Text(f"the demo failed: {exc}", style="red"))
        return 1


def _reaction(console: Console, node: LocalNode, fast: dict[str, Any]) -> None:
    phase_events = node.call(Op.TIMELINE, code="PROTECTION_PHASE_ON", limit=5)["events"]
    latency = next((e["data"].get("latency_ms") for e in reversed(phase_events) if "latency_ms" in e["data"]), None)
    console.print(
        Panel.fit(
            f"phase write → jobs paused: {latency if latency is not None else '?'} ms after the watcher read it "
            f"(fast path p50 {fast['p50_ms']} ms, p99 {fast['p99_ms']} ms over {fast['count']} change(s))",
            title="reaction",
        )
    )
