"""The ``signal`` translator against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import JobTarget, PluginContext, PluginError, ProcessRef
from arbiter_testing import run_as
from arbiter_testing.waiting import wait_until
from arbiter_translators import ControlDocTranslator, SignalTranslator, arbiter_register_translators
from arbiter_translators.identity import Signaller

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, stdout: int | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(list(argv or ("sleep", "60")), stdout=stdout)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def translator(tmp_path: Path) -> SignalTranslator:
    return SignalTranslator(SignalTranslator.Options(), PluginContext(state_dir=tmp_path))


def ref_of(pid: int) -> ProcessRef:
    return ProcessRef(pid, psutil.Process(pid).create_time())


def target(*refs: ProcessRef) -> JobTarget:
    return JobTarget(job_id="j1", name="batch", processes=tuple(refs))


def status_becomes(pid: int, wanted: str, timeout: float = 10.0) -> str:
    def status() -> str | None:
        now = psutil.Process(pid).status()
        return str(now) if now == wanted else None

    return wait_until(status, timeout, f"pid {pid} {wanted}", poll_s=0.005)


def never_signalled(pid: int) -> bool:
    """Asleep, with no signal pending.  Read in this order, a signal sent before the call
    shows one way or the other (still pending, or acted on: stopped or ended), however late
    a loaded host lets the process run; a sleeping process that was sent nothing is this at
    once, so nothing is left to wait out."""
    pending = 0
    status = Path(f"/proc/{pid}/status")
    if status.exists():  # Linux: elsewhere, what the process did is all there is to see
        for line in status.read_text().splitlines():
            if line.startswith(("SigPnd:", "ShdPnd:")):
                pending |= int(line.split()[1], 16)
    return not pending and psutil.Process(pid).status() == psutil.STATUS_SLEEPING


def test_registers_every_kind() -> None:
    seen: dict[str, type] = {}
    arbiter_register_translators(lambda name, cls: seen.__setitem__(name, cls))
    assert seen["signal"] is SignalTranslator and seen["control_doc"] is ControlDocTranslator
    assert set(seen) == {"signal", "control_doc", "cgroup_freeze", "http_post", "gpu_profile", "cuda_checkpoint"}
    assert SignalTranslator.actions == {"pause", "resume", "terminate", "kill"}
    assert ControlDocTranslator.actions == {"control"}


def test_pause_stops_and_resume_continues_a_real_process(tmp_path: Path, spawn: Spawn) -> None:
    proc = spawn()
    ref = ref_of(proc.pid)
    t = translator(tmp_path)
    assert t.available() == (True, "")
    assert t.pause(target(ref)) == [ref]
    assert status_becomes(proc.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    assert t.pause(target(ref)) == [ref]  # idempotent
    t.resume([ref])
    assert status_becomes(proc.pid, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING
    t.resume([ref])


def test_a_tree_is_paused_root_first(tmp_path: Path, spawn: Spawn) -> None:
    procs = [spawn() for _ in range(5)]
    refs = [ref_of(p.pid) for p in procs]
    t = translator(tmp_path)
    assert t.pause(target(*refs)) == refs
    for p in procs:
        assert status_becomes(p.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    t.resume(refs)
    for p in procs:
        assert status_becomes(p.pid, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING


def test_a_ref_with_another_start_time_is_never_signalled(tmp_path: Path, spawn: Spawn) -> None:
    proc = spawn()
    real = ref_of(proc.pid)
    t = translator(tmp_path)
    for wrong in (ProcessRef(proc.pid, real.start_time + 1.0), ProcessRef(proc.pid, real.start_time - 0.02)):
        assert t.pause(target(wrong)) == []
        t.terminate(target(wrong))
        t.kill(target(wrong))
    wait_until(lambda: never_signalled(proc.pid), 10, "the process asleep, never signalled")
    assert proc.poll() is None


def test_a_vanished_pid_is_skipped_silently(tmp_path: Path, spawn: Spawn) -> None:
    gone = spawn()
    ref = ref_of(gone.pid)
    gone.kill()
    gone.wait(timeout=10)
    alive = spawn()
    alive_ref = ref_of(alive.pid)
    t = translator(tmp_path)
    assert t.pause(target(ref, alive_ref)) == [alive_ref]
    t.resume([ref, alive_ref])
    t.terminate(target(ref))
    t.kill(target(ref))


def test_terminate_ends_even_a_paused_process(tmp_path: Path, spawn: Spawn) -> None:
    proc = spawn()
    ref = ref_of(proc.pid)
    t = translator(tmp_path)
    t.pause(target(ref))
    assert status_becomes(proc.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    t.terminate(target(ref))
    assert proc.wait(timeout=5) == -signal.SIGTERM


def test_kill(tmp_path: Path, spawn: Spawn) -> None:
    # A process that ignores SIGTERM still ends on kill.
    proc = spawn(
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)",
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    ref = ref_of(proc.pid)
    t = translator(tmp_path)
    t.terminate(target(ref))
    wait_until(lambda: never_signalled(proc.pid), 10, "the process asleep: SIGTERM ignored, and nothing else sent")
    assert proc.poll() is None
    t.kill(target(ref))
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_never_signals_itself_or_a_process_group(tmp_path: Path, spawn: Spawn) -> None:
    proc = spawn()
    ref = ref_of(proc.pid)
    me = ref_of(os.getpid())
    t = translator(tmp_path)
    with pytest.raises(PluginError, match="daemon itself") as err:
        t.pause(target(me, ref))
    assert "1 process" in str(err.value)  # the other process was still paused
    assert status_becomes(proc.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    t.resume([ref])
    for bad in (0, -1):
        with pytest.raises(PluginError, match="not a process id"):
            t.kill(target(ProcessRef(bad, 0.0)))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become nobody")
def test_a_process_it_may_not_signal_is_an_error_that_says_why(tmp_path: Path, spawn: Spawn) -> None:
    victim = spawn()
    ref = ref_of(victim.pid)
    t = translator(tmp_path)

    def attempt() -> str:
        try:
            t.pause(target(ref))
        except PluginError as exc:
            return str(exc)
        return "paused"

    message = run_as("nobody", attempt)
    assert "not permitted" in message and "CAP_KILL" in message, message
    assert psutil.Process(victim.pid).status() == psutil.STATUS_SLEEPING


def test_start_time_check_agrees_with_psutil_over_many_processes(spawn: Spawn) -> None:
    # The fast path computes start times itself; refs come from psutil's values.
    signaller = Signaller()
    procs = [spawn() for _ in range(20)]
    for p in procs:
        assert signaller.send(ref_of(p.pid), 0)


def test_a_signalled_process_is_signalled_again_through_its_kept_descriptor(
    monkeypatch: pytest.MonkeyPatch, spawn: Spawn
) -> None:
    proc = spawn()
    ref = ref_of(proc.pid)
    signaller = Signaller()
    assert signaller.send(ref, signal.SIGSTOP)
    assert status_becomes(proc.pid, psutil.STATUS_STOPPED) == psutil.STATUS_STOPPED
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: object, **kwargs: object) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", counting_open)
        assert signaller.send(ref, signal.SIGCONT)  # no start-time check: the descriptor names that process
    assert opened == []
    assert status_becomes(proc.pid, psutil.STATUS_SLEEPING) == psutil.STATUS_SLEEPING
    kept = signaller._kept[ref]
    proc.kill()
    proc.wait(timeout=10)
    assert not signaller.send(ref, 0)  # gone: the kept descriptor is dropped, and closed
    assert ref not in signaller._kept
    with pytest.raises(OSError):
        os.fstat(kept)


def test_a_kept_descriptor_of_a_gone_process_never_stands_for_the_pid_now(spawn: Spawn) -> None:
    # a reused pid: the kept descriptor names the old process, so the pid is checked afresh
    dead = spawn()
    stale = os.open(f"/proc/{dead.pid}", os.O_RDONLY | os.O_DIRECTORY)
    dead.kill()
    dead.wait(timeout=10)
    alive = spawn()
    real = ref_of(alive.pid)
    signaller = Signaller()
    wrong = ProcessRef(alive.pid, real.start_time + 5.0)  # the ref of an earlier process at this pid
    signaller._kept[wrong] = stale
    assert signaller.deliver(wrong, signal.SIGSTOP)[0] == "reused"
    wait_until(lambda: never_signalled(alive.pid), 10, "the process asleep, never signalled")
    signaller._kept[real] = os.open(f"/proc/{alive.pid}", os.O_RDONLY | os.O_DIRECTORY)
    signaller.close()
    assert signaller._kept == {}


def test_settle_returns_once_a_paused_process_has_stopped(tmp_path: Path, spawn: Spawn) -> None:
    t = translator(tmp_path)
    refs = [ref_of(spawn().pid) for _ in range(3)]
    t.pause(target(*refs))
    assert t.settle(refs, timeout_s=5.0)
    # no wait after it: each has stopped already
    assert [psutil.Process(r.pid).status() for r in refs] == [psutil.STATUS_STOPPED] * 3


def test_settle_gives_up_at_its_deadline_on_a_process_that_runs(tmp_path: Path, spawn: Spawn) -> None:
    t = translator(tmp_path)
    proc = spawn()
    ref = ref_of(proc.pid)
    t.pause(target(ref))
    os.kill(proc.pid, signal.SIGCONT)  # continued by someone else: it will not stop
    started = time.monotonic()
    assert not t.settle([ref], timeout_s=0.05)
    assert 0.05 <= time.monotonic() - started < 2.0


def test_settle_counts_an_exited_process_as_settled_and_one_never_signalled_as_untold(
    tmp_path: Path, spawn: Spawn
) -> None:
    t = translator(tmp_path)
    ended, zombie, other = spawn(), spawn(), spawn()
    refs = [ref_of(ended.pid), ref_of(zombie.pid)]
    t.pause(target(*refs))
    ended.kill()
    ended.wait()
    os.kill(zombie.pid, signal.SIGKILL)  # not reaped: a zombie
    assert status_becomes(zombie.pid, psutil.STATUS_ZOMBIE) == psutil.STATUS_ZOMBIE
    assert t.settle(refs, timeout_s=5.0)
    # no descriptor kept for it, so nothing tells whether it stopped: no wait, and not True
    started = time.monotonic()
    assert not t.settle([ref_of(other.pid)], timeout_s=5.0)
    assert time.monotonic() - started < 1.0
