"""The ``fake`` reader: both process forms, share integration and unreadable files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from arbiter.plugin import GpuReading, PluginContext
from arbiter_testing import FakeReader, arbiter_register_readers, write_state
from arbiter_testing.waiting import wait_until


def reader(path: Path) -> FakeReader:
    options = FakeReader.Options.model_validate({"kind": "fake", "state_file": str(path)})
    return FakeReader(options, PluginContext(state_dir=path.parent))


def test_registers_fake() -> None:
    seen: dict[str, type] = {}
    arbiter_register_readers(lambda name, cls: seen.__setitem__(name, cls))
    assert seen == {"fake": FakeReader}


def test_state_file_is_required() -> None:
    with pytest.raises(ValidationError, match="state_file"):
        FakeReader.Options.model_validate({"kind": "fake"})


def test_explicit_busy_ns_and_device_fields(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_state(
        path,
        {
            "readable": True,
            "device": "gpu",
            "vram_total_bytes": 8 << 30,
            "vram_free_bytes": 6 << 30,
            "processes": {
                "10": {"busy_ns": {"gfx": 5_000, "copy": 7}, "vram_bytes": 1 << 30},
                "11": {"busy_ns": {"gfx": 1}},
            },
        },
    )
    reading = reader(path).read([10, 12])
    assert reading.readable and reading.device == "gpu"
    assert reading.vram_total_bytes == 8 << 30 and reading.vram_free_bytes == 6 << 30
    assert set(reading.processes) == {10}  # only pids asked for, and only those the file has
    assert reading.processes[10].busy_ns == {"gfx": 5_000, "copy": 7}
    assert reading.processes[10].vram_bytes == 1 << 30
    assert abs(reading.at_ns - time.monotonic_ns()) < 1e9


def test_busy_share_integrates_over_wall_time(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_state(path, {"processes": {"20": {"busy_share": 0.4, "vram_bytes": 100}, "21": {"busy_share": 0.0}}})
    r = reader(path)
    first = r.read([20, 21])

    def integrated() -> GpuReading | None:
        reading = r.read([20, 21])  # each read integrates from the one before
        return reading if reading.processes[20].busy_ns["gfx"] - first.processes[20].busy_ns["gfx"] >= 1e8 else None

    second = wait_until(integrated, 10, "0.1 s of busy time")
    wall = second.at_ns - first.at_ns
    busy = second.processes[20].busy_ns["gfx"] - first.processes[20].busy_ns["gfx"]
    assert busy == pytest.approx(0.4 * wall, rel=0.01)
    assert second.processes[21].busy_ns["gfx"] == 0
    assert second.processes[20].vram_bytes == 100


def test_a_new_share_holds_from_when_the_file_was_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_state(path, {"processes": {"30": {"busy_share": 1.0}}})
    r = reader(path)
    first = r.read([30])
    # Time passes unread on both sides of the rewrite: what the reader makes of it is the
    # point, so no read may mark it, and nothing else says how long is enough.  The figures
    # are the times measured, however long a loaded host took.
    time.sleep(0.3)
    writing = time.monotonic_ns()
    write_state(path, {"processes": {"30": {"busy_share": 0.0}}})
    written = time.monotonic_ns()
    time.sleep(0.3)
    second = r.read([30])
    busy = second.processes[30].busy_ns["gfx"] - first.processes[30].busy_ns["gfx"]
    # Busy the whole time until the rewrite, idle after it (file times are a few ms coarse).
    assert writing - first.at_ns - 30e6 <= busy <= written - first.at_ns + 5e6, (busy, writing, written)

    def later() -> GpuReading | None:
        reading = r.read([30])
        assert reading.processes[30].busy_ns["gfx"] == second.processes[30].busy_ns["gfx"]  # idle: never grows
        return reading if reading.at_ns - second.at_ns >= 1e8 else None

    wait_until(later, 10, "reads over 0.1 s")


def test_busy_time_never_goes_back_when_a_process_switches_form(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_state(path, {"processes": {"40": {"busy_ns": {"gfx": 10**9}}}})
    r = reader(path)
    assert r.read([40]).processes[40].busy_ns["gfx"] == 10**9
    write_state(path, {"processes": {"40": {"busy_share": 0.5}}})

    def grown() -> bool:
        busy = r.read([40]).processes[40].busy_ns["gfx"]
        assert busy >= 10**9  # not even for one read
        return busy > 10**9

    wait_until(grown, 10, "the busy time to grow at the new share")


def test_missing_and_unparseable_files_are_unreadable_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    r = reader(path)
    missing = r.read([1])
    assert not missing.readable and str(path) in missing.why and "does not exist" in missing.why
    path.write_text('{"processes": {')
    broken = r.read([1])
    assert not broken.readable and str(path) in broken.why and "not valid" in broken.why
    path.write_text('{"processes": {"1": {"busy_share": 3}}}')
    assert "busy_share must be a number from 0 to 1" in r.read([1]).why
    path.write_text('{"processes": {"x": {"busy_share": 0.1}}}')
    assert "not a pid" in r.read([1]).why
    os.unlink(path)
    path.mkdir()
    assert not r.read([1]).readable


def test_the_file_may_say_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_state(path, {"readable": False, "why": "driver reset", "processes": {"1": {"busy_share": 1}}})
    reading = reader(path).read([1])
    assert not reading.readable and reading.why == "driver reset" and reading.processes == {}


def test_a_process_the_fake_driver_holds_checkpointed_holds_no_vram(tmp_path: Path) -> None:
    state = tmp_path / "gpu.json"
    write_state(
        state,
        {
            "vram_total_bytes": 10 << 30,
            "vram_free_bytes": 4 << 30,
            "processes": {
                "7": {"busy_share": 0.0, "vram_bytes": 5 << 30},
                "8": {"busy_share": 0.0, "vram_bytes": 1 << 30},
            },
        },
    )
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "7").write_text("checkpointed\n")
    (tmp_path / "driver" / "8").write_text("running\n")
    options = FakeReader.Options(state_file=str(state), cuda_dir=str(tmp_path / "driver"))
    got = FakeReader(options, PluginContext(state_dir=tmp_path)).read([7, 8])
    assert got.processes[7].vram_bytes == 0 and got.processes[8].vram_bytes == 1 << 30
    assert got.vram_free_bytes == 9 << 30
