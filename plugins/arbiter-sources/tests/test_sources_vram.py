"""``vram``: busy while the tenant holds more VRAM than a level, from the VRAM the daemon
hands over on the tick (here read by the ``fake`` reader from a fake server's state file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_sources.vram import VramSource
from arbiter_testing import GIB, FakeLlmServer, FakeModel, FakeReader, VramBoard, wait_until


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def vram_source(tmp_path: Path, above_gb: float, clock: Clock | None = None) -> VramSource:
    options = VramSource.Options.model_validate({"kind": "vram", "above_gb": above_gb})
    return VramSource(options, PluginContext(state_dir=tmp_path), clock=clock or Clock())


def test_options_need_a_level() -> None:
    with pytest.raises(ValidationError, match="above_gb"):
        VramSource.Options.model_validate({"kind": "vram"})
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        VramSource.Options.model_validate({"kind": "vram", "above_gb": -1})


def test_unknown_until_the_tick_hands_vram_over(tmp_path: Path) -> None:
    src = vram_source(tmp_path, 1)
    assert VramSource.uses_vram
    assert not src.state().readable and src.state().busy is None


def test_busy_strictly_above_the_level_and_changed_at_moves_only_on_a_change(tmp_path: Path) -> None:
    clock = Clock()
    src = vram_source(tmp_path, 2, clock)
    src.tenant_vram(2 * GIB)
    assert src.state().readable and src.state().busy is False and "not above 2 GB" in src.state().why
    first = src.state().changed_at
    clock.t += 1
    src.tenant_vram(GIB)
    assert src.state().changed_at == first  # still idle: nothing changed
    clock.t += 1
    src.tenant_vram(2 * GIB + 1)
    assert src.state().busy is True and src.state().changed_at == clock.t


def test_vram_that_cannot_be_read_is_unknown(tmp_path: Path) -> None:
    src = vram_source(tmp_path, 2)
    src.tenant_vram(5 * GIB)
    src.tenant_vram(None)
    state = src.state()
    assert not state.readable and state.busy is None and "cannot read" in state.why


def test_from_a_fake_servers_vram_through_the_fake_reader(tmp_path: Path) -> None:
    board = VramBoard(tmp_path / "gpu.json", 24 * GIB)
    reader = FakeReader(
        FakeReader.Options.model_validate({"kind": "fake", "state_file": str(board.path)}),
        PluginContext(state_dir=tmp_path),
    )
    src = vram_source(tmp_path, 1)

    def tick(pids: list[int]) -> None:  # what the daemon does: read, sum the tenant's processes, hand over
        reading = reader.read(pids)
        held = None if not reading.readable else sum(p.vram_bytes or 0 for p in reading.processes.values())
        src.tenant_vram(held)

    with FakeLlmServer(board, [FakeModel("m", 4 * GIB)], pid=31337) as llm:
        tick([31337])
        assert src.state().busy is False
        llm.load("m")
        tick([31337])
        assert src.state().busy is True
        llm.unload("m")
        wait_until(lambda: board.held(31337) == 0, 5, "the unload")
        tick([31337])
        assert src.state().busy is False
    (tmp_path / "gpu.json").write_text("not json")
    tick([31337])
    assert src.state().busy is None
