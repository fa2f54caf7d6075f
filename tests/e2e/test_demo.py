"""`arbiter demo`, the README's first command, runs the whole story and leaves nothing behind."""

from __future__ import annotations

import io

import psutil

from arbiter.cli.render import console
from arbiter.demo.story import run_demo


def test_the_demo_runs_the_story_and_earns_its_certificate_through_a_paired_run() -> None:
    before = {p.pid for p in psutil.process_iter()}
    out = io.StringIO()
    assert run_demo(console=console(file=out, width=160)) == 0, out.getvalue()[-4000:]
    text = out.getvalue()
    assert "phase write → jobs paused" in text and "$ arbiter ab show ab-" in text
    assert "earned a certificate" in text or "earned no certificate" in text  # what the run found, either way
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before
        and any(mark in " ".join(p.info["cmdline"] or []) for mark in ("arbiter.demo", "arbiter-demo-"))
    ]
    assert not leftovers, [p.info["cmdline"] for p in leftovers]
