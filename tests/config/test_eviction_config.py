"""A rule's ``eviction:`` settings (how the jobs its protection evicts save their work) are
judged where the rule is: a signal that is not one is refused at its line, with the nearest
signal's name, and a time out of range says its bounds."""

from __future__ import annotations

from pathlib import Path

from arbiter.config.loader import check_paths
from arbiter.pluginmanager import build_plugin_manager

BASE = "id: t\nmatch: {name: [x]}\npause_fleet: {scope: gpu}\n"


def problems(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "t.yaml").write_text(BASE + text)
    host = build_plugin_manager()
    found = check_paths([tmp_path], host.options_model, host.kind_names).problems.get(str(tmp_path / "t.yaml"), [])
    host.close()
    return [str(p) for p in found]


def test_a_rules_eviction_settings_take_a_signal_and_a_bounded_time(tmp_path: Path) -> None:
    for good in ("USR1", "SIGUSR2", "B:USR1", "B:SIGTERM", "usr1", "10"):
        assert problems(tmp_path, f"eviction: {{checkpoint_signal: '{good}', checkpoint_s: 30}}\n") == [], good
    assert problems(tmp_path, "eviction: {checkpoint_s: 0}\n") == []


def test_a_signal_that_is_not_one_is_refused_at_its_line_with_the_nearest(tmp_path: Path) -> None:
    (said,) = problems(tmp_path, "eviction:\n  checkpoint_signal: B:UST1\n")
    assert "t.yaml:5" in said and "eviction.checkpoint_signal" in said, said
    assert "'UST1' is not a signal name" in said and "did you mean USR1" in said, said
    (said,) = problems(tmp_path, "eviction: {checkpoint_signal: 'X:USR1'}\n")
    assert "only B (the batch shell) or R" in said, said


def test_a_checkpoint_time_out_of_range_and_a_misspelt_key_are_refused(tmp_path: Path) -> None:
    (said,) = problems(tmp_path, "eviction: {checkpoint_s: -1}\n")
    assert "checkpoint_s" in said and "greater than or equal to 0" in said, said
    (said,) = problems(tmp_path, "eviction: {checkpoint_s: 601}\n")
    assert "less than or equal to 600" in said, said
    (said,) = problems(tmp_path, "eviction: {checkpoint_sig: USR1}\n")
    assert "checkpoint_sig" in said and "checkpoint_signal" in said, said
