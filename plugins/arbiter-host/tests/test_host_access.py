"""``access``: device files and other users' processes, on a faked root and on this host."""

from __future__ import annotations

import os
from pathlib import Path

from arbiter.plugin import PluginContext
from arbiter_host import AccessHostSignal


def signal(tmp_path: Path, root: Path | None = None) -> AccessHostSignal:
    return AccessHostSignal(AccessHostSignal.Options(), PluginContext(state_dir=tmp_path), root=root or Path("/"))


def test_device_files_this_account_may_not_open_come_with_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dev" / "dri").mkdir(parents=True)
    open_one = root / "dev" / "dri" / "renderD128"
    closed = root / "dev" / "kfd"
    open_one.touch()
    closed.touch()
    closed.chmod(0)
    items = {i.what: i for i in signal(tmp_path, root).read().items}
    device = items["GPU device files"]
    if os.geteuid() == 0:  # root opens anything
        assert device.ok and "2" in device.detail
    else:
        assert not device.ok and str(closed) in device.detail and "render,video" in device.fix


def test_no_device_files_is_not_a_problem(tmp_path: Path) -> None:
    (tmp_path / "root" / "dev").mkdir(parents=True)
    items = {i.what: i for i in signal(tmp_path, tmp_path / "root").read().items}
    assert items["GPU device files"].ok and "none" in items["GPU device files"].detail


def test_this_host(tmp_path: Path) -> None:
    reading = signal(tmp_path).read()
    assert reading.user and {i.what for i in reading.items} == {"GPU device files", "other users' processes"}
    for item in reading.items:
        assert item.ok or item.fix
