"""The SDK's duty governor and supervisor: exact idles with a fake clock, control documents
applied while idling, and a real workload paused and stopped through its document."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from arbiter.sdk import Control, Duty, Stopped, Supervisor
from arbiter.sdk.control import write_control_document
from arbiter_testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def run_unit(duty: Duty, clock: FakeClock, busy: float) -> None:
    with duty.unit():
        clock.now += busy


@pytest.mark.parametrize(
    ("d", "busy", "idle"), [(0.25, 0.1, 0.3), (0.5, 0.02, 0.02), (0.1, 0.005, 0.045), (1.0, 0.2, 0.0)]
)
def test_a_unit_of_b_seconds_at_duty_d_idles_b_times_1_minus_d_over_d(d: float, busy: float, idle: float) -> None:
    clock = FakeClock()
    duty = Duty(clock=clock, sleep=clock.sleep)
    duty.set(d)
    run_unit(duty, clock, busy)
    assert sum(clock.slept) == pytest.approx(idle)
    assert duty.idle_s == pytest.approx(idle) and duty.busy_s == pytest.approx(busy)


def test_over_many_units_the_busy_share_is_the_duty() -> None:
    clock = FakeClock()
    duty = Duty(clock=clock, sleep=clock.sleep)
    duty.set(0.3)
    start = clock.now
    for i in range(200):
        run_unit(duty, clock, 0.01 + 0.01 * (i % 3))
    assert duty.busy_s / (clock.now - start) == pytest.approx(0.3)


def test_oversleeping_is_given_back_but_never_more_than_one_idle() -> None:
    clock = FakeClock()

    def late_sleep(seconds: float) -> None:
        clock.sleep(seconds + 0.01)  # every sleep 10 ms late

    duty = Duty(clock=clock, sleep=late_sleep)
    duty.set(0.5)
    start = clock.now
    for _ in range(100):
        run_unit(duty, clock, 0.02)
    assert duty.busy_s / (clock.now - start) == pytest.approx(0.5, abs=0.02)


def test_scale_sizes_units_to_the_duty_share_of_a_second() -> None:
    clock = FakeClock()
    duty = Duty(clock=clock, sleep=clock.sleep)
    assert duty.scale() == 1.0
    duty.set(0.2)
    run_unit(duty, clock, 0.8)
    assert duty.scale() == pytest.approx(0.25)  # a unit a quarter the size fits 0.2 s
    size = 16 * duty.scale()
    run_unit(duty, clock, 0.8 * size / 16)  # the caller sized it from the last one
    assert duty.scale() == pytest.approx(1.0)  # and it now fits: sizes settle, never alternate
    run_unit(duty, clock, 0.05)
    assert duty.scale() == pytest.approx(4.0)  # small units may grow


class FakeCpu:
    """A thread's CPU time beside a FakeClock: it advances only while the unit runs."""

    def __init__(self) -> None:
        self.now = 7.0

    def __call__(self) -> float:
        return self.now


def test_a_cpu_unit_counts_the_cpu_time_it_ran_not_its_waits_for_a_cpu() -> None:
    clock, cpu = FakeClock(), FakeCpu()
    duty = Duty(device="cpu", clock=clock, sleep=clock.sleep, cpu_clock=cpu)
    duty.set(0.25)
    with duty.unit():
        clock.now += 0.2  # 0.2 s on the wall clock, half of it waiting for a CPU
        cpu.now += 0.1
    # it ran 0.1 s: the next unit begins 0.4 s after this one began, 0.2 s after it ended
    assert duty.busy_s == pytest.approx(0.1) and sum(clock.slept) == pytest.approx(0.2)


def test_a_cpu_unit_stopped_from_outside_idles_only_for_what_it_ran() -> None:
    clock, cpu = FakeClock(), FakeCpu()
    duty = Duty(device="cpu", clock=clock, sleep=clock.sleep, cpu_clock=cpu)
    duty.set(0.2)
    with duty.unit():
        clock.now += 3.0  # stopped 3 s in the middle of 10 ms of work
        clock.now += 0.01
        cpu.now += 0.01
    # the stop was idle enough: nothing is owed (it was 12 s of idle when the stop counted)
    assert duty.busy_s == pytest.approx(0.01) and sum(clock.slept) == pytest.approx(0.0)
    run_unit_cpu = 0.01
    with duty.unit():
        clock.now += run_unit_cpu
        cpu.now += run_unit_cpu
    assert sum(clock.slept) == pytest.approx(0.04)  # the next unit idles its own 0.01·(1−0.2)/0.2


def test_a_gpu_unit_continued_after_a_stop_counts_what_ran_after_and_one_unit_before() -> None:
    clock = FakeClock()
    duty = Duty(clock=clock, sleep=clock.sleep)
    duty.set(0.2)
    run_unit(duty, clock, 0.05)
    clock.slept.clear()
    with duty.unit():
        clock.now += 0.02
        clock.now += 3.0  # stopped (SIGSTOP) for 3 s
        duty.continued()  # what the SIGCONT handler does
        clock.now += 0.03
    # 0.03 after the continue plus at most the last unit (0.05) before it; stop time is idle
    assert duty.busy_s == pytest.approx(0.05 + 0.08)
    assert sum(clock.slept) == pytest.approx(0.0)  # 3.05 s since it began is more than 0.08/0.2


def test_no_idle_is_longer_than_the_longest_unit_allows() -> None:
    clock = FakeClock()
    duty = Duty(clock=clock, sleep=clock.sleep, max_unit_s=0.5)
    duty.set(0.2)
    run_unit(duty, clock, 30.0)  # a frozen cgroup, unseen: 30 s of wall time in one unit
    assert sum(clock.slept) == pytest.approx(0.0)  # 0.5/0.2 = 2.5 s since it began: owed nothing
    clock.slept.clear()
    run_unit(duty, clock, 0.8)
    # counted as 0.5 s: the next begins 2.5 s after it began, an idle under 0.5·(1−0.2)/0.2
    assert sum(clock.slept) == pytest.approx(2.5 - 0.8)


def test_a_real_job_stopped_mid_unit_resumes_within_its_own_idle(tmp_path: Path) -> None:
    # a unit of 0.3 s at duty 0.2 idles 1.2 s; stopped 3 s inside a unit, it once idled 13 s
    marks = tmp_path / "marks"
    script = (
        "import os, sys, time\n"
        "from arbiter.sdk import Duty\n"
        "device, marks = sys.argv[1], sys.argv[2]\n"
        "d = Duty(device=device); d.set(0.2)\n"
        "work = (lambda: time.sleep(0.3)) if device == 'gpu' else (lambda: [t := time.thread_time(), "
        "[0 for _ in iter(lambda: time.thread_time() - t < 0.3, False)]])\n"
        "for i in range(4):\n"
        "    with d.unit():\n"
        "        open(marks, 'a').write(f'{i} {time.monotonic()}\\n')\n"
        "        work()\n"
    )
    for device in ("gpu", "cpu"):
        marks.unlink(missing_ok=True)
        job = subprocess.Popen([sys.executable, "-c", script, device, str(marks)])
        try:

            def lines() -> list[list[str]]:
                return [x.split() for x in marks.read_text().splitlines()] if marks.exists() else []

            wait_until(lambda: len(lines()) >= 2, 30, "the second unit to begin")
            job.send_signal(signal.SIGSTOP)  # inside the second unit's 0.3 s (or in its idle)
            time.sleep(3.0)  # the outside pause being tested, not a wait for something
            job.send_signal(signal.SIGCONT)
            continued = time.monotonic()
            wait_until(lambda: len(lines()) >= 3, 30, "the unit after the stop to begin")
            after = float(lines()[2][1]) - continued
            print(f"{device}: the next unit began {after:.2f} s after the continue")
            # at most the rest of the unit (0.3 s) and its own idle (1.2 s), with room for a busy host
            assert after < 3.0, (device, after)
            assert job.wait(30) == 0
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()


def in_thread(body: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``body`` on a thread of its own (a daemon thread: a unit idling for ever must not
    hold the test run); the exception it raised, if any, lands in the list."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def test_a_pause_while_idling_buys_no_units_back_to_back(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.5)
    duty = Duty(ctl)
    second: dict[str, float] = {}

    def units() -> None:
        with duty.unit():
            time.sleep(0.1)  # the unit's work: 0.1 s idle due after it
            rewrite(ctl, "paused", 0.5, 2)  # the pause falls in that idle
        busy_before, started = duty.busy_s, time.monotonic()
        with duty.unit():
            time.sleep(0.1)  # the unit's work
        second.update(busy=duty.busy_s - busy_before, took=time.monotonic() - started)

    job, raised = in_thread(units)
    # paused well past the idle due (its waits while paused count as idle; unpaused, both
    # units would idle 0.2 s in all)
    wait_until(lambda: duty.idle_s >= 0.5, 30, "the job to idle paused for 0.5 s")
    rewrite(ctl, "run", 0.5, 3)
    wait_until(lambda: not job.is_alive(), 30, "the second unit to end")
    assert not raised
    # its own full idle (as long as the unit, at duty 0.5), no credit from the pause
    assert second["took"] >= 2 * second["busy"] - 1e-9


def test_gpu_duty_metric_every_two_seconds(tmp_path: Path) -> None:
    clock = FakeClock()
    events = tmp_path / "events.jsonl"
    duty = Duty(events=str(events), device="cpu", clock=clock, sleep=clock.sleep, cpu_clock=clock)
    duty.set(0.5)
    for _ in range(50):
        run_unit(duty, clock, 0.1)  # 0.2 s per unit: a report every 10 units
    duty.close()
    metrics = [json.loads(x) for x in events.read_text().splitlines()]
    assert len(metrics) == 5
    assert all(m["event"] == "metric" and m["name"] == "gpu_duty" and m["device"] == "cpu" for m in metrics)
    assert all(m["busy"] == pytest.approx(0.5) and m["duty"] == 0.5 for m in metrics)


def test_duty_zero_without_a_control_document_is_an_error_not_a_hang() -> None:
    duty = Duty()
    duty.set(0.0)
    with pytest.raises(RuntimeError, match="above 0"), duty.unit():
        pass


def control(tmp_path: Path, state: str = "run", duty: float = 1.0, seq: int = 1) -> Control:
    path = tmp_path / "control.json"
    write_control_document(str(path), state, duty, seq)
    return Control(str(path), install_handler=False)


def rewrite(ctl: Control, state: str, duty: float, seq: int, reason: str = "") -> None:
    """A new control document for ``ctl``, as the daemon writes one."""
    assert ctl.path is not None
    write_control_document(ctl.path, state, duty, seq, reason)


def one_unit(duty: Duty, work_s: float = 0.05) -> Callable[[], None]:
    def body() -> None:
        with duty.unit():
            time.sleep(work_s)  # the unit's work

    return body


def test_a_new_duty_while_idling_changes_the_idle_at_once(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.001)  # a 50 ms unit would idle 50 s
    duty = Duty(ctl)
    job, raised = in_thread(one_unit(duty))
    wait_until(lambda: duty.units == 1, 30, "the unit's work to end: it idles now")
    rewrite(ctl, "run", 0.5, 2)
    # noticed within a wait slice (0.25 s) of the change, not after the 50 s first due
    wait_until(lambda: not job.is_alive(), 10, "the idle to end once the duty went up")
    assert duty.duty == 0.5 and not raised


def test_a_stop_while_idling_raises_stopped(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.001)  # a 50 ms unit would idle 50 s
    duty = Duty(ctl)
    job, raised = in_thread(one_unit(duty))
    wait_until(lambda: duty.units == 1, 30, "the unit's work to end: it idles now")
    rewrite(ctl, "stop", 0.0, 2, reason="owner asked")
    wait_until(lambda: not job.is_alive(), 10, "the idle to end on the stop")
    assert [type(e) for e in raised] == [Stopped] and "owner asked" in str(raised[0])


def test_duty_zero_and_paused_wait_for_a_run_above_zero(tmp_path: Path) -> None:
    ctl = control(tmp_path, state="paused", duty=0.0)
    duty = Duty(ctl)
    entered: list[float] = []

    def body() -> None:
        with duty.unit():
            entered.append(duty.duty)

    job, raised = in_thread(body)

    def waited_again() -> Callable[[], bool]:
        """True once the unit has finished a wait begun after this call (each wait is one
        slice, and ends by adding to its idle time)."""
        idle = duty.idle_s
        return lambda: duty.idle_s > idle

    wait_until(waited_again(), 30, "a wait while paused")
    assert not entered
    rewrite(ctl, "run", 0.0, 2)
    wait_until(lambda: ctl.seq == 2, 30, "the run at duty 0 to be read")
    again = waited_again()
    wait_until(again, 30, "the wait in which it was read to end")
    wait_until(waited_again(), 30, "a whole wait at duty 0")  # begun after duty 0 was taken
    assert not entered  # a run at duty 0 is no run
    rewrite(ctl, "run", 0.8, 3)
    wait_until(lambda: not job.is_alive(), 10, "the unit to run at duty 0.8")
    assert entered == [0.8] and not raised and duty.idle_s > 0


def test_the_sdk_is_vendorable_without_arbiter(tmp_path: Path) -> None:
    vendored = tmp_path / "myjob" / "_vendor" / "arbiter_sdk"
    shutil.copytree(ROOT / "arbiter" / "sdk", vendored, ignore=shutil.ignore_patterns("__pycache__"))
    for parent in (tmp_path / "myjob", tmp_path / "myjob" / "_vendor"):
        (parent / "__init__.py").touch()
    code = (
        "import sys; sys.path = ['.'] + [p for p in sys.path if 'site-packages' not in p]\n"
        "from myjob._vendor.arbiter_sdk import Duty\n"
        "d = Duty(); d.set(0.5)\n"
        "with d.unit(): pass\n"
        "assert not [m for m in sys.modules if m == 'arbiter' or m.startswith('arbiter.')], sys.modules\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "ok", out.stderr


def group_states(pgid: int) -> set[str]:
    """The states (as /proc gives them: R, S, T, Z...) of the processes of group ``pgid``."""
    states = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[2]) == pgid:
                states.add(fields[0])
    return states


def test_supervisor_follows_duty_pause_and_stop_of_a_real_workload(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.4)
    seen: list[float] = []
    ticks = tmp_path / "ticks"
    workload = [
        sys.executable,
        "-c",
        f"import time\nwhile True:\n    open({str(ticks)!r}, 'a').write('.')\n    time.sleep(0.01)",
    ]
    sup = Supervisor(workload, gpu_duty=seen.append, ctl=ctl, stop_grace_s=2)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(sup.run()))
    runner.start()
    try:
        wait_until(lambda: ticks.exists() and ticks.stat().st_size > 3, 30, "the workload to work")
        rewrite(ctl, "run", 0.7, 2)
        wait_until(lambda: len(seen) >= 2, 10, "the new duty to be handed on")
        assert seen == [0.4, 0.7]
        rewrite(ctl, "paused", 0.0, 3)
        assert sup.proc is not None
        group = sup.proc.pid  # the workload leads its own process group
        # the kernel's word that the whole group is stopped (so it writes no more ticks),
        # rather than a wait to see the ticks file not grow
        wait_until(lambda: group_states(group) == {"T"}, 10, "every process of its group to be stopped")
        rewrite(ctl, "stop", 0.0, 4)
        runner.join(30)
        assert result == [0] and sup.proc is not None and sup.proc.poll() is not None
    finally:
        if sup.proc is not None and sup.proc.poll() is None:
            sup.proc.kill()
        runner.join(5)
