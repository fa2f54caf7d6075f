"""The files the docs show are valid: rule files pass `arbiter check`, configs and manifests load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from arbiter.cli.nodecheck import node_problems
from arbiter.config.loader import check_paths, parse_manifest, parse_node_config
from arbiter.pluginmanager import build_plugin_manager

ROOT = Path(__file__).resolve().parents[2]
#: pages whose rule files use only shipped kinds (plugins.md's are checked with the example installed)
PAGES = ["getting-started.md", "rule-files.md", "node-config.md", "tenants.md"]


@pytest.mark.parametrize("page", PAGES)
def test_rule_files_shown_are_valid(
    page: str, blocks: Callable[[str, str], list[tuple[str, str]]], tmp_path: Path
) -> None:
    rules = [(name, text) for name, text in blocks(page, "yaml") if name.startswith("tenants.d/")]
    if page != "node-config.md":
        assert rules, f"docs/{page} shows no rule file (a yaml block starting `# tenants.d/NAME.yaml`)"
    for name, text in rules:
        (tmp_path / Path(name).name).write_text(text)
    host = build_plugin_manager()
    try:
        ruleset = check_paths([tmp_path], host.options_model, host.kind_names, bases=[ROOT / "tenants.d"])
    finally:
        host.close()
    problems = [str(p) for file_problems in ruleset.problems.values() for p in file_problems]
    assert not problems, f"docs/{page}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_node_configs_and_manifests_shown_are_valid(
    page: str, blocks: Callable[[str, str], list[tuple[str, str]]]
) -> None:
    host = build_plugin_manager()
    try:
        for name, text in blocks(page, "yaml"):
            if name == "arbiter.yaml":
                # what `arbiter check` and start-up ask of it: the kinds it names are installed
                problems = node_problems(parse_node_config(text, f"docs/{page}"), None, host)
                assert not problems, f"docs/{page}:\n" + "\n".join(map(str, problems))
            elif name == "job.yaml":
                parse_manifest(text, f"docs/{page}")
    finally:
        host.close()
