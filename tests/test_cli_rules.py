"""`arbiter rules`: a rule's effective form after `extends:`, the processes its match: selects
now, and the near misses with the field that missed, read without a daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from arbiter.cli import main

TRAINER = "import time\nwhile True:\n    time.sleep(1)\n"


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A trainer launched the way people launch one: `cd trainer && python main.py`."""
    folder = tmp_path / "trainer"
    folder.mkdir()
    (folder / "main.py").write_text(TRAINER)
    proc = subprocess.Popen([sys.executable, "main.py"], cwd=folder)
    yield proc
    proc.kill()
    proc.wait()


def node(tmp_path: Path, *rules: str) -> Path:
    tenants = tmp_path / "tenants.d"
    tenants.mkdir()
    for i, text in enumerate(rules):
        (tenants / f"r{i}.yaml").write_text(text)
    config = tmp_path / "arbiter.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\ntenants_dirs: [{tenants}]\n")
    return config


def rules(config: Path, *args: str) -> tuple[int, Any]:
    out = CliRunner().invoke(main.app, ["rules", *args, "--config", str(config), "--json"])
    return out.exit_code, json.loads(out.output) if out.exit_code == 0 else out.output


def test_a_rule_that_misses_names_the_near_miss_and_the_field(tmp_path: Path, trainer: subprocess.Popen[bytes]) -> None:
    config = node(tmp_path, "id: trainer\nmatch: {cmdline: [train.py]}\n")
    code, answer = rules(config, "trainer")
    assert code == 0, answer
    (rule,) = answer["rules"]
    assert not rule["selects"]
    near = next(n for n in rule["near_misses"] if n["pid"] == trainer.pid)
    assert any(m.startswith("cmdline: no 'train.py' in") for m in near["missed"]), near
    assert "closest to 'train.py': 'main.py'" in near["missed"], near


def test_a_rule_selects_the_launch_people_use_and_the_higher_rule_claims_first(
    tmp_path: Path, trainer: subprocess.Popen[bytes]
) -> None:
    config = node(
        tmp_path,
        "id: trainer\nmatch: {script: [trainer/main.py]}\n",
        f"id: first\npriority: 90\nmatch: {{script: [main.py], cwd: [{tmp_path / 'trainer'}]}}\n",
    )
    code, answer = rules(config)
    assert code == 0, answer
    by_id = {r["id"]: r for r in answer["rules"]}
    assert [p["pid"] for p in by_id["first"]["selects"]] == [trainer.pid]
    assert trainer.pid not in [p["pid"] for p in by_id["trainer"]["selects"]]
    assert (trainer.pid, "first") in [(p["pid"], p["rule"]) for p in by_id["trainer"]["claimed_first_by"]]


def test_the_effective_form_follows_extends(tmp_path: Path) -> None:
    config = node(tmp_path, "extends: llm-server\npriority: 33\n")
    code, answer = rules(config, "llm-server")
    assert code == 0, answer
    (rule,) = answer["rules"]
    assert rule["rule"]["priority"] == 33 and rule["rule"]["match"]  # the base's match, the change merged
    assert len(rule["files"]) == 2 and rule["files"][0].endswith("llm-server.yaml")


def test_an_unknown_id_says_which_it_may_mean(tmp_path: Path) -> None:
    config = node(tmp_path, "id: trainer\nmatch: {cmdline: [train.py]}\n")
    code, answer = rules(config, "trainr")
    assert code == 2 and "did you mean 'trainer'?" in answer
