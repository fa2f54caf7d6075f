"""`arbiter check` names every pair of rules that select the same processes and the rule
that owns them; a pair only the ids' order decides is a problem.  The shipped rules pass."""

from __future__ import annotations

import shutil
from pathlib import Path

from arbiter.cli.checks import run_check
from arbiter.daemon.ownership import Overlap, overlap_lines

ROOT = Path(__file__).resolve().parents[2]


def check(folder: Path) -> tuple[list[str], list[Overlap]]:
    found: list[Overlap] = []
    problems, _ = run_check(None, [folder], found)
    return [str(p) for p in problems], found


def test_the_shipped_rules_pass_together_and_llama_swap_owns_its_llama_servers() -> None:
    problems, found = check(ROOT / "tenants.d")
    assert problems == []
    pair = [o for o in found if {o.first, o.second} == {"llama-swap", "llama-server"}]
    assert [(o.owner, o.why) for o in pair] == [("llama-swap", "tree")]
    assert any("'llama-server'" in line and "inside 'llama-swap''s tree" in line for line in overlap_lines(found))


def test_a_clashing_rule_is_named_with_the_rule_that_wins(tmp_path: Path) -> None:
    folder = tmp_path / "tenants.d"
    shutil.copytree(ROOT / "tenants.d", folder)
    (folder / "my-llama.yaml").write_text("id: my-llama\npriority: 50\nmatch: {name: [llama-server]}\n")
    problems, found = check(folder)
    assert len(problems) == 1
    assert "'llama-server' and 'my-llama' both select `/usr/bin/llama-server`" in problems[0]
    assert "'llama-server' owns it, only because its id sorts before 'my-llama'" in problems[0]
    assert "higher priority" in problems[0]
    (folder / "my-llama.yaml").write_text("id: my-llama\npriority: 70\nmatch: {name: [llama-server]}\n")
    problems, found = check(folder)
    assert problems == []
    pair = next(o for o in found if {o.first, o.second} == {"llama-server", "my-llama"})
    assert (pair.owner, pair.why) == ("my-llama", "priority")
    assert "overlap: 'my-llama' and 'llama-server' both select" in "\n".join(overlap_lines(found))
