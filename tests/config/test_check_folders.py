"""`arbiter check` on a node config with an error still checks the rule folders it names, and
does not report the default folders, which it never named, as missing."""

from __future__ import annotations

from pathlib import Path

from arbiter.cli.checks import run_check


def test_a_config_error_leaves_its_valid_tenants_dirs_in_force(tmp_path: Path) -> None:
    (tmp_path / "tenants.d").mkdir()
    (tmp_path / "tenants.d" / "t.yaml").write_text("id: t\nmatch: {cmdlin: [x]}\n")
    config = tmp_path / "arbiter.yaml"
    config.write_text("tick_s: soon\ntenants_dirs: [tenants.d]\n")
    problems, checked = run_check(str(config), [])
    said = "\n".join(map(str, problems))
    assert "tick_s" in said and "cmdlin" in said  # both files' problems
    assert "no such file or directory" not in said, said
    assert str(tmp_path / "tenants.d" / "t.yaml") in checked


def test_a_config_error_does_not_report_the_default_folders(tmp_path: Path) -> None:
    config = tmp_path / "arbiter.yaml"
    config.write_text("tick_s: soon\n")
    problems, _ = run_check(str(config), [])
    said = "\n".join(map(str, problems))
    assert "tick_s" in said and "no such file or directory" not in said, said
