"""A translator in a role it cannot do is refused where the rule is judged (check, the
daemon's load), not at the first handoff that asks it to act."""

from __future__ import annotations

from pathlib import Path

from arbiter.config.loader import check_paths
from arbiter.pluginmanager import build_plugin_manager


def test_a_translator_that_cannot_release_or_reacquire_is_refused_with_those_that_can(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(
        "id: t\nmatch: {name: [x]}\nrelease: {kind: signal}\nreacquire: {kind: gpu_profile}\n"
    )
    host = build_plugin_manager()
    problems = check_paths([tmp_path], host.options_model, host.kind_names).problems[str(tmp_path / "t.yaml")]
    said = {p.field: (p.line, p.message, p.hint) for p in problems}
    assert said["release.kind"][0] == 3
    assert "the signal translator cannot release" in said["release.kind"][1]
    assert "http_post" in said["release.kind"][2]
    assert "the gpu_profile translator cannot reacquire" in said["reacquire.kind"][1]
    host.close()


def test_each_role_takes_a_translator_that_can_do_it(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(
        "id: t\nmatch: {name: [x]}\nbase_url: http://127.0.0.1:9\n"
        "release: {kind: http_post, url: /free}\nreacquire: {kind: http_post, url: /wake}\n"
    )
    host = build_plugin_manager()
    assert not check_paths([tmp_path], host.options_model, host.kind_names).problems
    assert host.kind_names("translators:release") == ["http_post"]
    host.close()
