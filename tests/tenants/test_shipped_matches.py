"""The shipped rules select the processes of the programs they are written for, however
those are started today."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiter.config.loader import check_paths, validate_kind_options
from arbiter.plugin import ProcessInfo
from arbiter.pluginmanager import build_plugin_manager
from arbiter_matchers.process import ProcessMatcher

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    (
        "sglang",
        ProcessInfo(
            500,
            1,
            name="sglang",
            cmdline=("/venv/bin/python3", "/venv/bin/sglang", "serve", "--model-path", "Qwen/Qwen3-8B"),
        ),
    ),
    (
        "sglang",
        ProcessInfo(501, 1, name="python3", cmdline=("python3", "-m", "sglang.launch_server", "--model-path", "m")),
    ),
    (
        "vllm",
        ProcessInfo(502, 1, name="vllm", cmdline=("/venv/bin/python3", "/venv/bin/vllm", "serve", "Qwen/Qwen3-8B")),
    ),
    ("desktop-compositor", ProcessInfo(503, 1, name="cosmic-comp")),
    ("desktop-compositor", ProcessInfo(504, 1, name="gamescope-wl")),
    ("desktop-compositor", ProcessInfo(505, 1, name="wayfire")),
]


@pytest.mark.parametrize(("rule_id", "process"), CASES, ids=[f"{r}:{p.name}" for r, p in CASES])
def test_the_shipped_rule_selects_its_program(rule_id: str, process: ProcessInfo) -> None:
    host = build_plugin_manager()
    ruleset = check_paths([ROOT / "tenants.d"], host.options_model, host.kind_names)
    block = ruleset.rules[rule_id].match
    matcher = ProcessMatcher(validate_kind_options(block, ProcessMatcher.Options))
    assert matcher.select([process]) == {process.pid}
    host.close()
