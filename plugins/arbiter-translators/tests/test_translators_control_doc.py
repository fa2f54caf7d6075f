"""The ``control_doc`` translator: the control document and the nudge, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import ControlUpdate, JobTarget, PluginContext, PluginError, ProcessRef
from arbiter_testing.waiting import wait_until
from arbiter_translators import ControlDocTranslator

_COOPERATIVE = """
import signal, time
seen, fence = [], []
signal.signal(signal.SIGUSR1, lambda *_: seen.append(1))
signal.signal(signal.SIGUSR2, lambda *_: fence.append(1))
print("ready", flush=True)
while True:
    time.sleep(0.005)  # not signal.pause(): a nudge landing just before it would be missed
    if seen:
        seen.clear()
        print("nudged", flush=True)
    if fence:  # after any nudge sent before it: pending, the lower-numbered signal is taken first
        fence.clear()
        print("fence", flush=True)
"""


def translator(tmp_path: Path) -> ControlDocTranslator:
    return ControlDocTranslator(ControlDocTranslator.Options(), PluginContext(state_dir=tmp_path))


def control_path(state_dir: Path, job_id: str = "j1") -> Path:
    """Where the daemon keeps a job's control document: the only place the translator writes one."""
    path = state_dir / "jobs" / job_id / "control.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def ref_of(pid: int) -> ProcessRef:
    return ProcessRef(pid, psutil.Process(pid).create_time())


@pytest.fixture
def cooperative() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _COOPERATIVE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def never_signalled(pid: int) -> bool:
    """Asleep, with no signal pending.  Read in this order, a signal sent before the call
    shows one way or the other (still pending, or acted on: the process ended), however late
    a loaded host lets it run; a sleeping process that was sent nothing is this at once."""
    pending = 0
    status = Path(f"/proc/{pid}/status")
    if status.exists():  # Linux: elsewhere, what the process did is all there is to see
        for line in status.read_text().splitlines():
            if line.startswith(("SigPnd:", "ShdPnd:")):
                pending |= int(line.split()[1], 16)
    return not pending and psutil.Process(pid).status() == psutil.STATUS_SLEEPING


def read_line_within(proc: subprocess.Popen[str], timeout: float) -> str | None:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else None


def test_writes_the_document(tmp_path: Path) -> None:
    path = control_path(tmp_path)
    job = JobTarget(job_id="j1", name="batch", processes=(), control_path=str(path))
    t = translator(tmp_path)
    t.control(job, ControlUpdate(state="paused", gpu_duty=0.25, reason="trainer is uploading"), seq=7)
    assert json.loads(path.read_text()) == {
        "v": 1,
        "seq": 7,
        "state": "paused",
        "gpu_duty": 0.25,
        "reason": "trainer is uploading",
    }
    t.control(job, ControlUpdate(state="run", gpu_duty=1.0), seq=8)
    doc = json.loads(path.read_text())
    assert (doc["seq"], doc["state"], doc["gpu_duty"], doc["reason"]) == (8, "run", 1.0, "")
    assert sorted(p.name for p in path.parent.iterdir()) == ["control.json"]  # no temporary left behind


def test_readers_never_see_half_a_document(tmp_path: Path) -> None:
    path = control_path(tmp_path)
    job = JobTarget(job_id="j1", name="batch", processes=(), control_path=str(path))
    t = translator(tmp_path)
    t.control(job, ControlUpdate(state="run", gpu_duty=1.0, reason="x" * 5000), seq=0)
    stop = threading.Event()
    bad: list[str] = []

    def watch() -> None:
        while not stop.is_set():
            text = path.read_text()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for seq in range(1, 300):
            t.control(job, ControlUpdate(state="run", gpu_duty=seq / 300, reason="x" * 5000), seq=seq)
    finally:
        stop.set()
        watcher.join()
    assert bad == []
    assert json.loads(path.read_text())["seq"] == 299


def test_a_cooperative_job_is_nudged(tmp_path: Path, cooperative: subprocess.Popen[str]) -> None:
    path = control_path(tmp_path)
    job = JobTarget(
        job_id="j1", name="batch", processes=(ref_of(cooperative.pid),), control_path=str(path), cooperative=True
    )
    translator(tmp_path).control(job, ControlUpdate(state="paused", gpu_duty=0.0), seq=1)
    assert read_line_within(cooperative, 5) == "nudged\n"


def test_no_nudge_without_cooperative_or_with_a_stale_ref(tmp_path: Path, cooperative: subprocess.Popen[str]) -> None:
    path = control_path(tmp_path)
    ref = ref_of(cooperative.pid)
    t = translator(tmp_path)
    t.control(JobTarget("j1", "batch", (ref,), str(path), cooperative=False), ControlUpdate("paused", 0.0), seq=1)
    stale = ProcessRef(ref.pid, ref.start_time - 5)
    t.control(JobTarget("j1", "batch", (stale,), str(path), cooperative=True), ControlUpdate("paused", 0.0), seq=2)
    # a fence, not a wait: a nudge sent before it would be printed before it, however late it ran
    os.kill(cooperative.pid, signal.SIGUSR2)
    assert read_line_within(cooperative, 10) == "fence\n"
    assert json.loads(path.read_text())["seq"] == 2


def test_a_job_without_a_handler_is_not_killed_by_a_document_write(tmp_path: Path) -> None:
    # The nudge's default action ends a process: only cooperative jobs get it.
    proc = subprocess.Popen(["sleep", "60"])
    try:
        job = JobTarget("j1", "batch", (ref_of(proc.pid),), str(control_path(tmp_path)), cooperative=False)
        translator(tmp_path).control(job, ControlUpdate("stop", 0.0, reason="ending"), seq=1)
        wait_until(lambda: never_signalled(proc.pid), 10, "the job asleep, never nudged")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_errors_say_what_to_do(tmp_path: Path) -> None:
    t = translator(tmp_path)
    with pytest.raises(PluginError, match="no control document path"):
        t.control(JobTarget("j1", "batch", ()), ControlUpdate("run", 1.0), seq=1)
    missing_dir = tmp_path / "jobs" / "j9" / "control.json"  # where it goes, but its folder is gone
    with pytest.raises(PluginError, match="must exist"):
        t.control(JobTarget("j9", "batch", (), str(missing_dir)), ControlUpdate("run", 1.0), seq=1)
    with pytest.raises(PluginError, match="not one of"):
        t.control(JobTarget("j1", "batch", (), str(control_path(tmp_path))), ControlUpdate("sleep", 1.0), seq=1)  # type: ignore[arg-type]
    assert not os.path.exists(control_path(tmp_path))


@pytest.mark.parametrize("where", ["elsewhere", "traversal", "other job"])
def test_a_control_document_is_written_only_where_arbiter_keeps_it(tmp_path: Path, where: str) -> None:
    """A paused record names the document to write: one naming any other file (a record
    someone else wrote, say) has nothing written."""
    bait = tmp_path / "precious"
    bait.write_text("keep")
    path = {
        "elsewhere": str(bait),
        "traversal": str(tmp_path / "jobs" / "j1" / ".." / ".." / "precious"),
        "other job": str(control_path(tmp_path, "j2")),
    }[where]
    job = JobTarget(job_id="j1", name="batch", processes=(), control_path=path)
    with pytest.raises(PluginError, match="where arbiter keeps it"):
        translator(tmp_path).control(job, ControlUpdate("paused", 0.0, "x"), 1)
    assert bait.read_text() == "keep" and not (tmp_path / "jobs" / "j2" / "control.json").exists()
