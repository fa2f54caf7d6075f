"""A server's busy probe says busy or idle, and why, wherever its sources are shown: the
command line's sources table, explain and the status page, not only --json."""

from __future__ import annotations

import io

from arbiter.cli.render import console, print_explain, sources_table
from arbiter.daemon.sources import says
from arbiter.http.page import sources_section
from arbiter.plugin import SourceState
from arbiter_testing.answers import rule_answer

BUSY = {
    "slot": "busy",
    "kind": "http_count",
    "readable": True,
    "needs_helper": False,
    "why": "1 listed",
    "busy": True,
    "phase": None,
    "rate": 0.0,
    "read_by": "daemon",
    "latency": {"count": 0},
    "says": "busy (1 listed)",
}


def test_a_busy_probe_says_busy_or_idle_with_why() -> None:
    assert says(SourceState(readable=True, busy=True, why="1 listed")) == "busy (1 listed)"
    assert says(SourceState(readable=True, busy=False)) == "idle"
    assert says(SourceState(readable=True, phase="on")) == "on"
    assert says(SourceState(readable=True)) == "reads"


def test_the_table_explain_and_page_show_it() -> None:
    rule = rule_answer("llm-server", running=True, gpu_share=0.0, gpu_why="", sources=[BUSY], faults=[])
    out = io.StringIO()
    con = console(file=out, width=200)
    con.print(sources_table([rule]))
    assert "busy (1 listed)" in out.getvalue()
    out = io.StringIO()
    print_explain(
        console(file=out, width=200), {"subject": "llm-server", "notices": [], "items": [{**rule, "kind": "rule"}]}
    )
    assert "its busy probe says busy (1 listed)" in out.getvalue()
    assert "busy (1 listed)" in sources_section([rule])
