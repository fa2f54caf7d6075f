"""release_when_busy says when a release is safe: it needs a release, and takes one of three
values, each said where the rule is judged."""

from __future__ import annotations

from pathlib import Path

from arbiter.config.loader import check_paths
from arbiter.pluginmanager import build_plugin_manager

BASE = "id: t\nmatch: {name: [x]}\nbase_url: http://127.0.0.1:9\n"


def problems(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "t.yaml").write_text(BASE + text)
    host = build_plugin_manager()
    found = check_paths([tmp_path], host.options_model, host.kind_names).problems.get(str(tmp_path / "t.yaml"), [])
    host.close()
    return [str(p) for p in found]


def test_release_when_busy_needs_a_release_and_one_of_its_values(tmp_path: Path) -> None:
    assert any("add a release: block" in p for p in problems(tmp_path, "release_when_busy: wait\n"))
    said = problems(tmp_path, "release: {kind: http_post, url: /free}\nrelease_when_busy: later\n")
    assert said and "release_when_busy" in said[0] and "'wait'" in said[0]
    assert (
        problems(tmp_path, "release: {kind: http_post, url: /free}\nrelease_when_busy: skip\ndrain_timeout_s: 5\n")
        == []
    )
