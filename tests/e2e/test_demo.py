"""`arbiter demo`, the README's first command, runs the whole story and leaves nothing behind."""

from __future__ import annotations

import io
import os

from arbiter.cli.render import console
from arbiter.demo.story import run_demo
from arbiter.probing import PROBE_TIMEOUT_S
from arbiter_testing.marks import NODEID_VAR, cmdline, marked
from arbiter_testing.waiting import wait_until


def test_the_demo_runs_the_story_through_a_paired_run() -> None:
    out = io.StringIO()
    assert run_demo(console=console(file=out, width=160)) == 0, out.getvalue()[-4000:]
    text = out.getvalue()
    assert "phase write → jobs paused" in text and "$ arbiter ab show ab-" in text
    assert "earned a certificate" in text or "earned no certificate" in text  # what the run found, either way
    # every process the demo started carries this test's mark (other tests run beside it); a
    # GPU API probe the daemon started may still be finishing, within its own timeout
    mine = os.environ[NODEID_VAR]
    try:
        wait_until(lambda: not marked(nodeid=mine), PROBE_TIMEOUT_S + 5, "the demo's processes to end")
    except AssertionError:
        raise AssertionError([cmdline(pid) for pid in marked(nodeid=mine)]) from None
