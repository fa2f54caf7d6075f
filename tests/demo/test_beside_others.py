"""`arbiter demo` beside other runs on the same host: a second demo in another terminal, or a
stray process whose command line looks like the demo's protected stand-in.  Each demo's rule
selects the stand-in that run started and nothing else, and each run tells its story to the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.probing import PROBE_TIMEOUT_S
from arbiter_testing.marks import NODEID_VAR, cmdline, marked
from arbiter_testing.waiting import wait_until

pytestmark = pytest.mark.slow

#: a story's steps wait 45 s each at most; this is a deadline for the whole run, not a delay
DEMO_S = 240.0
DONE = "done in "


def start_demo(out: Path) -> subprocess.Popen[bytes]:
    """``arbiter demo`` as a person runs it, its output into ``out`` as it is printed."""
    # into a file, with no COLUMNS (a test runner may set one), it prints a line unwrapped
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    with open(out, "wb") as fh:  # the demo keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "arbiter", "demo"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
        )


def selected_counts(text: str) -> list[int]:
    """How many processes the demo's rule selected, in each view of its tenants table (the
    `running` column: ``yes (N)``; the other columns say a plain yes or no)."""
    return [int(n) for n in re.findall(r"\byes \((\d+)\)", text)]


def assert_told_alone(out: Path, code: int | None) -> None:
    text = out.read_text()
    assert code == 0, text[-4000:]
    last = text.strip().splitlines()[-2]
    assert last.startswith(DONE) and "nothing is left running" in last, text[-2000:]
    counts = selected_counts(text)
    # its own stand-in, seen while it ran, and never another beside it
    assert counts and set(counts) == {1}, (counts, text[-4000:])


def nothing_left(spared: frozenset[int] = frozenset()) -> None:
    """Every process the demos started has ended (a GPU API probe a daemon started may still
    be finishing, within its own timeout)."""
    mine = os.environ[NODEID_VAR]

    def left() -> set[int]:
        return set(marked(nodeid=mine)) - spared

    try:
        wait_until(lambda: not left(), PROBE_TIMEOUT_S + 5, "the demos' processes to end")
    except AssertionError:
        raise AssertionError([cmdline(pid) for pid in left()]) from None


def test_two_demos_at_once_each_see_their_own_stand_in_and_pass(tmp_path: Path) -> None:
    outs = [tmp_path / "first.txt", tmp_path / "second.txt"]
    demos = [start_demo(out) for out in outs]
    overlapped = False

    def both_ended() -> bool:
        nonlocal overlapped
        texts = [out.read_text() for out in outs]
        # each prints its first step once it ends, just before it starts its stand-in: both
        # past it, neither done, and both stand-ins run at once
        overlapped = overlapped or all("1. A cooperative job" in t and DONE not in t for t in texts)
        return all(d.poll() is not None for d in demos)

    try:
        wait_until(both_ended, DEMO_S, "both demos to end", poll_s=0.05)
    finally:
        for d in demos:
            if d.poll() is None:
                d.kill()
                d.wait()
    for out, d in zip(outs, demos, strict=True):
        assert_told_alone(out, d.returncode)
    assert overlapped, "the two demos did not run at the same time"
    roots = {m.group(1) for out in outs if (m := re.search(r"state in (\S+)", out.read_text()))}
    assert len(roots) == 2, roots  # each in a folder of its own
    nothing_left()


def test_a_demo_beside_a_stray_stand_in_looks_only_at_its_own(tmp_path: Path) -> None:
    # a busy stand-in that is none of the demo's: started as the demo starts its own, from a
    # folder named as the demo's are, and it never goes idle
    stray_events = tmp_path / "arbiter-demo-stray" / "trainer-events.jsonl"
    stray_events.parent.mkdir()
    stray = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "arbiter.demo.protected",
            "--events",
            str(stray_events),
            "--step-s",
            "0.01",
            "--gap-s",
            "0.01",
        ]
    )
    try:
        wait_until(lambda: stray_events.exists() and stray_events.stat().st_size > 0, 30, "the stray to work")
        out = tmp_path / "demo.txt"
        demo = start_demo(out)
        try:
            code = demo.wait(DEMO_S)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
        assert stray.poll() is None  # it ran beside the demo all along, and the demo left it be
        assert_told_alone(out, code)
        nothing_left(spared=frozenset({stray.pid}))
    finally:
        stray.terminate()
        stray.wait(10)
