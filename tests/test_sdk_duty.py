"""The SDK's duty governor and supervisor: exact idles with a fake clock, control documents
applied while idling, and a real workload paused and stopped through its document."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from arbiter.sdk import Control, Duty, Stopped, Supervisor
from arbiter.sdk.control import write_control_document

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


def test_a_pause_while_idling_buys_no_units_back_to_back(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.5)
    duty = Duty(ctl)
    threading.Timer(0.05, write_control_document, (ctl.path, "paused", 0.5, 2)).start()
    threading.Timer(0.6, write_control_document, (ctl.path, "run", 0.5, 3)).start()
    with duty.unit():
        time.sleep(0.1)  # due: 0.1 s idle; a 0.5 s pause falls in it
    started = time.monotonic()
    with duty.unit():
        time.sleep(0.1)
    assert time.monotonic() - started >= 0.19  # its own full idle, no credit from the pause


def test_gpu_duty_metric_every_two_seconds(tmp_path: Path) -> None:
    clock = FakeClock()
    events = tmp_path / "events.jsonl"
    duty = Duty(events=str(events), device="cpu", clock=clock, sleep=clock.sleep)
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


def test_a_new_duty_while_idling_changes_the_idle_at_once(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.01)  # a 50 ms unit would idle 4.95 s
    duty = Duty(ctl)
    threading.Timer(0.2, write_control_document, (ctl.path, "run", 0.5, 2)).start()
    started = time.monotonic()
    with duty.unit():
        time.sleep(0.05)
    took = time.monotonic() - started
    assert duty.duty == 0.5 and took < 0.6  # 0.05 busy + at most one wait slice after the change


def test_a_stop_while_idling_raises_stopped(tmp_path: Path) -> None:
    ctl = control(tmp_path, duty=0.01)
    duty = Duty(ctl)
    threading.Timer(0.1, write_control_document, (ctl.path, "stop", 0.0, 2), {"reason": "owner asked"}).start()
    with pytest.raises(Stopped, match="owner asked"), duty.unit():
        time.sleep(0.05)


def test_duty_zero_and_paused_wait_for_a_run_above_zero(tmp_path: Path) -> None:
    ctl = control(tmp_path, state="paused", duty=0.0)
    duty = Duty(ctl)
    threading.Timer(0.2, write_control_document, (ctl.path, "run", 0.0, 2)).start()
    threading.Timer(0.4, write_control_document, (ctl.path, "run", 0.8, 3)).start()
    started = time.monotonic()
    with duty.unit():
        pass
    assert time.monotonic() - started >= 0.35 and duty.duty == 0.8 and duty.idle_s >= 0.35


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
        deadline = time.monotonic() + 5
        while not (ticks.exists() and ticks.stat().st_size > 3) and time.monotonic() < deadline:
            time.sleep(0.02)
        write_control_document(ctl.path, "run", 0.7, 2)
        time.sleep(0.6)
        assert seen == [0.4, 0.7]
        write_control_document(ctl.path, "paused", 0.0, 3)
        time.sleep(0.6)
        size = ticks.stat().st_size
        time.sleep(0.3)
        assert ticks.stat().st_size == size  # its process group is stopped
        write_control_document(ctl.path, "stop", 0.0, 4)
        runner.join(10)
        assert result == [0] and sup.proc is not None and sup.proc.poll() is not None
    finally:
        if sup.proc is not None and sup.proc.poll() is None:
            sup.proc.kill()
        runner.join(5)
