"""`arbiter ab start` and `ab sweep` hold other GPU work for hours: they show the plan, then
start only when confirmed at a terminal or given --yes; --dry-run starts nothing."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from arbiter.cli import ab_commands, main

PLAN = {
    "rule": "trainer",
    "source": {"kind": "jsonl", "path": "/tmp/events.jsonl"},
    "source_rate": 12.0,
    "duty": None,
    "work": "gpu",
    "jobs": ["batch-1"],
    "off": "paused",
    "blocks": 12,
    "window_s": 300,
    "washout_s": 60,
    "margin": 0.02,
    "planned_hours": 2.4,
    "max_hours": 8,
    "run": "r1",
}


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The daemon's side: each operation asked, in order."""
    ops: list[str] = []

    def ask(config: str | None, op: str, key: str | None, **args: Any) -> Any:
        ops.append(op)
        return dict(PLAN)

    monkeypatch.setattr(ab_commands, "ask", ask)
    return ops


def run(monkeypatch: pytest.MonkeyPatch, *args: str, terminal: bool, typed: str = "") -> Any:
    monkeypatch.setattr(ab_commands, "_asks_a_person", lambda: terminal)
    return CliRunner().invoke(main.app, ["ab", *args], input=typed)


@pytest.mark.parametrize("command", [["start", "--rule", "trainer"], ["sweep", "--rule", "trainer"]])
def test_not_on_a_terminal_it_starts_only_with_yes(
    monkeypatch: pytest.MonkeyPatch, asked: list[str], command: list[str]
) -> None:
    out = run(monkeypatch, *command, terminal=False)
    assert out.exit_code == 2 and "--yes" in out.output
    assert "planned  2.40 h" in out.output  # the plan is shown all the same
    assert asked == ["ab.plan"]
    out = run(monkeypatch, *command, "--yes", terminal=False)
    assert out.exit_code == 0 and asked[-1] in ("ab.start", "ab.sweep") and "started  run r1" in out.output


def test_at_a_terminal_it_asks_and_no_is_the_default(monkeypatch: pytest.MonkeyPatch, asked: list[str]) -> None:
    out = run(monkeypatch, "start", "--rule", "trainer", terminal=True, typed="\n")
    assert "Start it? Other GPU work waits for about 2.4 h" in out.output
    assert out.exit_code == 1 and asked == ["ab.plan"]
    out = run(monkeypatch, "start", "--rule", "trainer", terminal=True, typed="y\n")
    assert out.exit_code == 0 and asked == ["ab.plan", "ab.plan", "ab.start"]


def test_dry_run_shows_the_plan_and_starts_nothing(monkeypatch: pytest.MonkeyPatch, asked: list[str]) -> None:
    out = run(monkeypatch, "start", "--rule", "trainer", "--dry-run", terminal=True)
    assert out.exit_code == 0 and "design   12 blocks" in out.output and asked == ["ab.plan"]
    out = run(monkeypatch, "start", "--rule", "trainer", "--dry-run", "--json", terminal=False)
    assert out.exit_code == 0 and '"planned_hours": 2.4' in out.output and asked == ["ab.plan", "ab.plan"]
