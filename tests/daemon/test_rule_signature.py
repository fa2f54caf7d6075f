"""The tick's look at the rule files: the very files the loader reads, and any change to
one of them (edited, added, removed) seen."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from arbiter.config.loader import rule_files
from arbiter.config.ruleset import RuleFileLook
from arbiter.daemon.rules import _signature


def test_the_signature_lists_what_the_loader_reads_and_changes_with_it(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.d"
    tenants.mkdir()
    for name in ("b.yaml", "a.yml", ".hidden.yaml", "notes.txt", "c.yaml"):
        (tenants / name).write_text("id: x\n")
    single = tmp_path / "one.yaml"
    single.write_text("id: y\n")
    paths = [tenants, single, tmp_path / "missing.d"]
    first = _signature(paths)
    assert [name for name, *_ in first] == [str(p) for p in rule_files(paths)]
    assert _signature(paths) == first

    (tenants / "b.yaml").write_text("id: x\nmatch: {}\n")  # edited: another size
    edited = _signature(paths)
    assert edited != first
    os.utime(tenants / "c.yaml", ns=(1, 1))  # touched: another mtime
    assert _signature(paths) != edited
    (tenants / "d.yaml").write_text("id: z\n")
    assert len(_signature(paths)) == len(first) + 1
    (tenants / "a.yml").unlink()
    assert len(_signature(paths)) == len(first)


def test_a_rule_file_replaced_by_one_of_its_size_and_mtime_changes_the_signature(tmp_path: Path) -> None:
    # what ``cp -p``, ``rsync -t`` or ``tar x`` leave: another file, its mtime kept
    tenants = tmp_path / "tenants.d"
    tenants.mkdir()
    rule = tenants / "game.yaml"
    rule.write_text("id: game\npriority: 10\n")
    os.utime(rule, ns=(10**18, 10**18))
    before = _signature([tenants])
    staged = tmp_path / "game.yaml"
    staged.write_text("id: game\npriority: 90\n")  # as long as the rule in force
    os.utime(staged, ns=(10**18, 10**18))
    os.replace(staged, rule)
    assert _signature([tenants]) != before


def test_a_folder_whose_stat_did_not_move_is_not_listed_again_and_its_files_are_still_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter.config import ruleset

    tenants = tmp_path / "tenants.d"
    tenants.mkdir()
    for name in ("a.yaml", "b.yaml"):
        (tenants / name).write_text("id: x\n")
    listed: list[str] = []
    scandir = os.scandir

    def counted(path: str) -> Any:
        listed.append(path)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    look = ruleset.RuleFileLook()
    old = time.time_ns() - 2 * ruleset.RECENT_NS
    os.utime(tenants, ns=(old, old))  # changed long enough ago for the clock to have moved on
    first = _signature([tenants], look)
    assert _signature([tenants], look) == first and listed == [str(tenants)]
    (tenants / "a.yaml").write_text("id: x\nmatch: {}\n")  # edited in place: the folder's stat stays
    os.utime(tenants, ns=(old, old))
    assert _signature([tenants], look) != first and listed == [str(tenants)]
    (tenants / "c.yaml").write_text("id: z\n")  # a new file moves the folder's mtime: listed again
    assert [name for name, *_ in _signature([tenants], look)][-1] == str(tenants / "c.yaml")
    assert len(listed) == 2
    # a folder changed a moment ago is listed on every look: another change within the same
    # tick of the kernel's clock would leave its mtime as it is
    _signature([tenants], look)
    assert len(listed) == 3


def _listed_then_added(tmp_path: Path, dated_ns: int) -> tuple[Path, RuleFileLook, list[str]]:
    """A folder holding ``a.yaml``, dated ``dated_ns``, looked at once; then ``b.yaml`` added
    with the folder's date kept: (the folder, its look, the names that look found)."""
    tenants = tmp_path / "tenants.d"
    tenants.mkdir()
    (tenants / "a.yaml").write_text("id: a\n")
    os.utime(tenants, ns=(dated_ns, dated_ns))
    look = RuleFileLook()
    first = [name for name, *_ in _signature([tenants], look)]
    (tenants / "b.yaml").write_text("id: b\n")
    os.utime(tenants, ns=(dated_ns, dated_ns))
    return tenants, look, first


def test_a_file_added_within_the_mtime_tick_of_the_last_listing_is_seen_on_a_later_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter.config import ruleset

    # a file dropped in right after a listing, within the same tick of the clock the folder
    # is dated by (a coarse filesystem): the folder's stat is as it was
    changed_at = time.time_ns() - ruleset.RECENT_NS // 4
    tenants, look, first = _listed_then_added(tmp_path, changed_at)
    assert first == [str(tenants / "a.yaml")]
    # the next look comes a tick of the daemon later, when the folder's mtime looks old
    later = changed_at + ruleset.RECENT_NS + 1_000_000_000
    monkeypatch.setattr(time, "time_ns", lambda: later)
    assert str(tenants / "b.yaml") in [name for name, *_ in _signature([tenants], look)]


def test_a_folder_dated_by_a_clock_behind_this_one_is_listed_afresh_each_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter.config import ruleset

    # a network filesystem's server whose clock runs a minute behind: the folder's mtime, just
    # changed, looks old, and its listing is trusted; a file added within the same tick of
    # that server's clock
    tenants, look, first = _listed_then_added(tmp_path, time.time_ns() - 60_000_000_000)
    assert first == [str(tenants / "a.yaml")]
    assert str(tenants / "b.yaml") not in [name for name, *_ in _signature([tenants], look)]
    later = time.monotonic_ns() + ruleset.FRESH_NS
    monkeypatch.setattr(time, "monotonic_ns", lambda: later)
    assert str(tenants / "b.yaml") in [name for name, *_ in _signature([tenants], look)]
