"""The ``log`` source reading progress bars: carriage returns end lines, and a named group
``count`` carries the count itself.  The last test follows a real tqdm in a real process."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext, SourceState
from arbiter_sources import LogSource
from arbiter_sources.log import parse_count
from arbiter_testing.waiting import wait_until

TQDM_REGEX = r"(?P<count>\d+(?:\.\d+)?[kMG]?)/(?P<total>\d+(?:\.\d+)?[kMG]?) \["


class Latest:
    def __init__(self) -> None:
        self.state: SourceState | None = None
        self.lock = threading.Lock()

    def __call__(self, state: SourceState) -> None:
        with self.lock:
            self.state = state


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., LogSource]]:
    made: list[LogSource] = []

    def build(**block: Any) -> LogSource:
        source = LogSource(
            LogSource.Options.model_validate({"kind": "log", **block}), PluginContext(state_dir=tmp_path)
        )
        made.append(source)
        return source

    yield build
    for source in made:
        source.close()


def count_of(source: LogSource) -> int:
    return source.state().count


def test_parse_count_reads_tqdm_scaled_counts() -> None:
    assert parse_count("370") == 370
    assert parse_count("1.21k") == 1210
    assert parse_count("3.4M") == 3_400_000
    assert parse_count("12.5") == 12  # rounded half to even, as Python rounds
    assert parse_count("lots") is None
    assert parse_count("3x") is None


def test_carriage_returns_end_lines(tmp_path: Path, make: Callable[..., LogSource]) -> None:
    path = tmp_path / "train.log"
    source = make(path=str(path), log_regex=r"it/s")
    source.start(Latest())
    with open(path, "wb") as fh:
        for i in range(5):
            fh.write(f"\r {i}/10 [00:0{i}<00:01, 1.00it/s]".encode())
            fh.flush()
        fh.write(b"\r\n")  # "\r\n" is one line end, not an empty line that counts
        fh.flush()
    wait_until(lambda: count_of(source) == 5, 5, "five redraws counted")
    assert source.malformed == 0


def test_a_count_group_gives_what_the_count_gained(tmp_path: Path, make: Callable[..., LogSource]) -> None:
    path = tmp_path / "train.log"
    source = make(path=str(path), log_regex=TQDM_REGEX)
    source.start(Latest())
    bars = ["0/1000 [", "370/1000 [", "500/1000 [", "1.00k/1.00k [", "20/1000 [", "1.2k/2k ["]
    with open(path, "w") as fh:
        fh.write("epoch 1\n")
        for i, bar in enumerate(bars):
            fh.write(f"\r{bar}00:0{i}<00:05, 118.2it/s]")
            fh.flush()
        fh.write("\n")
    # from 0: +370, +130, +500, then a new bar (20 < 1000) counts from zero: +20, then +1180
    wait_until(lambda: count_of(source) == 2200, 5, "the counts' gains summed")


def test_a_count_that_is_not_a_number_is_malformed(tmp_path: Path, make: Callable[..., LogSource]) -> None:
    path = tmp_path / "train.log"
    source = make(path=str(path), log_regex=r"step (?P<count>\S+)")
    source.start(Latest())
    with open(path, "w") as fh:
        fh.write("step 1\nstep two\nstep 4\n")
    wait_until(lambda: count_of(source) == 3, 5, "the numeric counts read")
    assert source.malformed == 1


def test_the_first_count_read_is_the_baseline(tmp_path: Path, make: Callable[..., LogSource]) -> None:
    path = tmp_path / "train.log"
    path.write_text("\r 40/100 [00:01<00:01, 40it/s]")  # there before the source opened
    source = make(path=str(path), log_regex=TQDM_REGEX)
    source.start(Latest())
    assert count_of(source) == 0
    with open(path, "a") as fh:
        fh.write("\r 45/100 [00:01<00:01, 40it/s]\r 47/100 [00:01<00:01, 40it/s]\r")
    # the bar being drawn when it opened (no line end after it yet) is the baseline
    wait_until(lambda: count_of(source) == 7, 5, "40 → 47")


def test_a_group_named_almost_count_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"did you mean \(\?P<count>"):
        LogSource.Options.model_validate({"kind": "log", "path": "/tmp/x.log", "log_regex": r"(?P<n>\d+)/"})


TRAINER = """
import sys, time
from tqdm import tqdm
with open(sys.argv[1], "w") as fh:
    for _ in tqdm(range(400), file=fh, mininterval=0.05, miniters=1):
        time.sleep(0.01)
"""


@pytest.mark.slow
def test_follows_a_real_tqdm_bar_while_it_runs(tmp_path: Path, make: Callable[..., LogSource]) -> None:
    pytest.importorskip("tqdm")
    path = tmp_path / "train.log"
    source = make(path=str(path), log_regex=TQDM_REGEX)
    source.start(Latest())
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(path)])
    try:
        # while the bar is still one line without a newline, the count already grows
        wait_until(lambda: count_of(source) >= 50 and proc.poll() is None, 30, "progress read mid-bar")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # tqdm's first redraw is 0/400, the baseline; the last is 400/400
    wait_until(lambda: count_of(source) == 400, 5, "the whole bar counted")
    assert source.malformed == 0
    assert b"\n" in path.read_bytes()[-2:]  # what it wrote ended with its own final newline
