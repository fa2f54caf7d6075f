"""The example kinds on real files: each change reaches on_change from the source's thread."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from arbiter_example_files import CounterFileSource, FlagFileSource, arbiter_register_sources
from pydantic import ValidationError

from arbiter.plugin import PluginContext, SourceState

WAIT_S = 10.0


class Changes:
    """What a source handed to on_change, waited for by condition."""

    def __init__(self) -> None:
        self.seen: queue.Queue[SourceState] = queue.Queue()

    def __call__(self, state: SourceState) -> None:
        self.seen.put(state)

    def until(self, ok: object) -> SourceState:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                state = self.seen.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if ok(state):  # type: ignore[operator]
                return state
        raise AssertionError(f"no state passing the check within {WAIT_S:g}s")


@pytest.fixture
def context(tmp_path: Path) -> PluginContext:
    return PluginContext(state_dir=tmp_path / "state")


@pytest.fixture
def started() -> Iterator[list[FlagFileSource | CounterFileSource]]:
    sources: list[FlagFileSource | CounterFileSource] = []
    yield sources
    for source in sources:
        source.close()


def test_it_registers_both_kinds() -> None:
    kinds: dict[str, type] = {}
    arbiter_register_sources(register=lambda name, cls: kinds.setdefault(name, cls))
    assert kinds == {"flag_file": FlagFileSource, "counter_file": CounterFileSource}


def test_options_refuse_a_relative_path_and_a_zero_poll() -> None:
    with pytest.raises(ValidationError, match="not an absolute path"):
        FlagFileSource.Options.model_validate({"path": "backup.flag"})
    with pytest.raises(ValidationError, match="greater than 0"):
        CounterFileSource.Options.model_validate({"path": "/tmp/x", "poll_s": 0})
    with pytest.raises(ValidationError, match="Extra inputs"):
        FlagFileSource.Options.model_validate({"path": "/tmp/x", "pth": "/tmp/y"})


def test_flag_file_phase_follows_the_files(tmp_path: Path, context: PluginContext, started: list) -> None:
    flag, soon = tmp_path / "upload.flag", tmp_path / "upload.soon"
    options = FlagFileSource.Options.model_validate({"path": str(flag), "soon_path": str(soon), "poll_s": 0.02})
    source = FlagFileSource(options, context)
    changes = Changes()
    source.start(changes)
    started.append(source)
    assert source.state().phase == "off" and source.state().readable
    soon.touch()
    changes.until(lambda s: s.phase == "soon")
    flag.touch()
    on = changes.until(lambda s: s.phase == "on")
    assert on.readable and on.changed_at <= time.monotonic()
    flag.unlink()
    soon.unlink()
    changes.until(lambda s: s.phase == "off")


def test_flag_file_in_a_missing_folder_is_unreadable_and_counts_as_on(
    tmp_path: Path, context: PluginContext, started: list
) -> None:
    options = FlagFileSource.Options.model_validate({"path": str(tmp_path / "gone" / "x.flag")})
    source = FlagFileSource(options, context)
    source.start(Changes())
    started.append(source)
    state = source.state()
    assert not state.readable and state.phase == "on" and "does not exist" in state.why


def test_counter_file_counts_what_the_program_writes(tmp_path: Path, context: PluginContext, started: list) -> None:
    path = tmp_path / "steps"
    options = CounterFileSource.Options.model_validate({"path": str(path), "poll_s": 0.02})
    source = CounterFileSource(options, context)
    changes = Changes()
    source.start(changes)
    started.append(source)
    assert not source.state().readable and "does not exist" in source.state().why
    for n in (1, 2, 40):
        tmp = tmp_path / "steps.tmp"
        tmp.write_text(f"{n}\n")
        os.replace(tmp, path)  # written whole, as a program should
        changes.until(lambda s, n=n: s.readable and s.count == n)
    path.write_text("lots")
    bad = changes.until(lambda s: not s.readable)
    assert "not a whole number" in bad.why


def test_refresh_reads_again_before_the_next_poll(tmp_path: Path, context: PluginContext, started: list) -> None:
    flag = tmp_path / "now.flag"
    source = FlagFileSource(FlagFileSource.Options.model_validate({"path": str(flag), "poll_s": 10}), context)
    changes = Changes()
    source.start(changes)
    started.append(source)
    flag.touch()
    source.refresh()
    assert changes.until(lambda s: s.phase == "on").readable
