"""A rule that runs a command loads only from a file and folders only trusted accounts change."""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
from pathlib import Path

import pytest

from arbiter.config.loader import check_paths
from arbiter.config.safety import command_file_problem
from arbiter.pluginmanager import build_plugin_manager

DAEMON = 1000
OTHER = 1001
TRUSTED = {0, DAEMON}


class FakeFs:
    """lstat/readlink over a dict: path → (type, mode, uid, nlink, link target)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[int, int, int, int, str]] = {}

    def add(self, path: str, kind: int, mode: int, uid: int = 0, nlink: int = 1, target: str = "") -> None:
        self.entries[path] = (kind, mode, uid, nlink, target)

    def _resolve_parents(self, path: str) -> str:
        """The path with symbolic links among its folders followed (as the kernel does)."""
        parts = [p for p in path.split("/") if p]
        current = ""
        for part in parts[:-1]:
            current = f"{current}/{part}"
            entry = self.entries.get(current)
            if entry and entry[0] == stat.S_IFLNK:
                current = entry[4]
        return f"{current}/{parts[-1]}" if parts else "/"

    def lstat(self, path: str) -> os.stat_result:
        path = self._resolve_parents(path)
        if path not in self.entries:
            raise FileNotFoundError(2, "No such file or directory", path)
        kind, mode, uid, nlink, _ = self.entries[path]
        return os.stat_result((kind | mode, 1, 1, nlink, uid, 0, 0, 0, 0, 0))

    def readlink(self, path: str) -> str:
        return self.entries[self._resolve_parents(path)][4]


def tree(
    file_owner: int = 0,
    file_mode: int = 0o644,
    file_link: bool = False,
    nlink: int = 1,
    dir_owner: int = 0,
    dir_mode: int = 0o755,
    dir_link: bool = False,
    link_owner: int = 0,
) -> FakeFs:
    """/etc/arbiter/tenants.d/r.yaml, with the options under test on the file or on tenants.d."""
    fs = FakeFs()
    fs.add("/", stat.S_IFDIR, 0o755)
    fs.add("/etc", stat.S_IFDIR, 0o755)
    fs.add("/etc/arbiter", stat.S_IFDIR, 0o755)
    if dir_link:
        fs.add("/etc/arbiter/tenants.d", stat.S_IFLNK, 0o777, link_owner, target="/srv/rules")
        fs.add("/srv", stat.S_IFDIR, 0o755)
        fs.add("/srv/rules", stat.S_IFDIR, dir_mode, dir_owner)
        real = "/srv/rules/r.yaml"
    else:
        fs.add("/etc/arbiter/tenants.d", stat.S_IFDIR, dir_mode, dir_owner)
        real = "/etc/arbiter/tenants.d/r.yaml"
    if file_link:
        fs.add(
            "/etc/arbiter/tenants.d/r.yaml" if not dir_link else real,
            stat.S_IFLNK,
            0o777,
            file_owner,
            target="/srv/x.yaml",
        )
    else:
        fs.add(real, stat.S_IFREG, file_mode, file_owner, nlink)
    return fs


def problem(fs: FakeFs) -> str | None:
    return command_file_problem("/etc/arbiter/tenants.d/r.yaml", TRUSTED, fs.lstat, fs.readlink)


OWNERS = (0, DAEMON, OTHER)
MODES = (0o644, 0o600, 0o664, 0o646, 0o1777)


@pytest.mark.parametrize(
    ("owner", "mode", "link", "nlink"), list(itertools.product(OWNERS, MODES[:4], (False, True), (1, 2)))
)
def test_the_file_matrix(owner: int, mode: int, link: bool, nlink: int) -> None:
    why = problem(tree(file_owner=owner, file_mode=mode, file_link=link, nlink=nlink))
    # other hard links are no matter: owner and mode are the contents', whatever the name
    safe = owner in TRUSTED and not mode & 0o022 and not link
    assert (why is None) == safe, why
    if link:
        assert why and "symbolic link" in why
    elif owner not in TRUSTED:
        assert why and f"owned by uid {OTHER}" in why
    elif mode & 0o022:
        assert why and "writable by" in why and f"{mode:04o}" in why


@pytest.mark.parametrize(
    ("owner", "mode", "link", "link_owner"),
    [
        (o, m, link, lo)
        for o, m, link, lo in itertools.product(OWNERS, MODES, (False, True), (0, OTHER))
        if link or lo == 0
    ],
)
def test_the_folder_matrix(owner: int, mode: int, link: bool, link_owner: int) -> None:
    mode_dir = mode if mode != 0o644 else 0o755
    why = problem(tree(dir_owner=owner, dir_mode=mode_dir, dir_link=link, link_owner=link_owner))
    sticky = bool(mode_dir & 0o1000)  # others may add entries, but rename or remove only their own
    safe = owner in TRUSTED and (sticky or not mode_dir & 0o022) and (not link or link_owner in TRUSTED)
    assert (why is None) == safe, why
    if link and link_owner not in TRUSTED:
        assert why and "symbolic link /etc/arbiter/tenants.d" in why
    elif not safe:
        assert why and ("/srv/rules" if link else "/etc/arbiter/tenants.d") in why


def test_a_sticky_folder_is_safe_only_as_far_as_its_owner_and_the_entry_below() -> None:
    assert problem(tree(dir_mode=0o1777)) is None  # as /tmp: the file below is root's, and only root may move it
    why = problem(tree(dir_mode=0o1777, file_owner=OTHER))
    assert why and f"owned by uid {OTHER}" in why
    why = problem(tree(dir_mode=0o1777, dir_owner=OTHER))
    assert why and f"owned by uid {OTHER}" in why
    assert "writable by its group and everyone" in (problem(tree(dir_mode=0o777)) or "")


def test_a_missing_file_cannot_be_checked() -> None:
    fs = FakeFs()
    fs.add("/", stat.S_IFDIR, 0o755)
    assert "cannot check" in (command_file_problem("/etc/r.yaml", TRUSTED, fs.lstat, fs.readlink) or "")


EXEC_RULE = """id: counted
match: {name: [trainer]}
protect:
  source: {kind: exec, command: [/usr/bin/true]}
"""


def test_check_refuses_an_exec_rule_in_an_unsafe_file(tmp_path: Path) -> None:
    host = build_plugin_manager()
    unsafe = tmp_path / "rules"
    unsafe.mkdir()
    (unsafe / "counted.yaml").write_text(EXEC_RULE)
    (unsafe / "counted.yaml").chmod(0o666)
    ruleset = check_paths([unsafe], host.options_model, host.kind_names)
    [p] = ruleset.problems[str(unsafe / "counted.yaml")]
    assert p.field == "protect.source.kind" and p.line == 4
    assert "runs a command" in p.message and "writable by" in p.message and "chmod go-w" in p.hint


def test_check_accepts_an_exec_rule_in_a_safe_file() -> None:
    folder = Path(tempfile.mkdtemp(prefix=".arbiter-safety-", dir=Path.home()))
    try:
        folder.chmod(0o755)
        rule = folder / "counted.yaml"
        rule.write_text(EXEC_RULE)
        rule.chmod(0o644)
        above = command_file_problem(str(folder / "x"))
        if above and str(folder) not in above and "cannot check" not in above:
            pytest.skip(f"a folder above this account's home is not safe: {above}")
        host = build_plugin_manager()
        ruleset = check_paths([folder], host.options_model, host.kind_names)
        assert not ruleset.problems and "counted" in ruleset.rules
    finally:
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
