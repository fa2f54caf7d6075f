"""explain names a rule whose source advances while no process matches it: the rule most
likely misses its program, and `arbiter rules` shows why."""

from __future__ import annotations

import io

from arbiter.cli.render import console, print_explain
from arbiter.daemon.views import misses_its_program
from arbiter.engine import codes
from arbiter_testing.answers import rule_answer

LOG = {"slot": "progress", "kind": "log", "readable": True, "rate": 45.0}


def test_an_advancing_source_with_no_process_is_named_with_the_way_to_see_why() -> None:
    (problem,) = misses_its_program("trainer", [LOG])
    assert problem["code"] == codes.RULE_MATCHES_NOTHING
    assert "advances at 45/s while no process matches" in problem["message"]
    assert "`arbiter rules trainer`" in problem["remedy"]
    out = io.StringIO()
    item = rule_answer("trainer", kind="rule", faults=[], sources=[LOG], notes=[], problems=[problem])
    print_explain(console(file=out, width=300), {"subject": "trainer", "notices": [], "items": [item]})
    assert "RULE_MATCHES_NOTHING" in out.getvalue() and "arbiter rules trainer" in out.getvalue()


def test_a_quiet_or_unreadable_source_says_nothing_of_the_match() -> None:
    assert misses_its_program("t", [{**LOG, "rate": None}, {**LOG, "rate": 0.0}, {**LOG, "readable": False}]) == []


def test_explain_shows_a_certificate_withheld_because_the_effect_changed() -> None:
    note = {
        "code": codes.AB_EFFECT_CHANGED,
        "message": "its last paired run r1 certified nothing: the effect changed during the run",
        "remedy": "`arbiter ab show r1` shows the blocks",
    }
    out = io.StringIO()
    item = rule_answer("trainer", kind="rule", faults=[], sources=[], notes=[note], problems=[])
    print_explain(console(file=out, width=300), {"subject": "trainer", "notices": [], "items": [item]})
    assert "AB_EFFECT_CHANGED" in out.getvalue() and "the effect changed during the run" in out.getvalue()
