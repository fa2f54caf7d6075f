"""The tick's look at the rule files: the very files the loader reads, and any change to
one of them (edited, added, removed) seen."""

from __future__ import annotations

import os
from pathlib import Path

from arbiter.config.loader import rule_files
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
    assert [name for name, _, _ in first] == [str(p) for p in rule_files(paths)]
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
