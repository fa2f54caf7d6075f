"""The rule files of the tenants dirs: finding them (:func:`rule_files`), reading them, adding
the shipped bases an ``extends:`` may name, and checking a set of them together
(:func:`check_paths`, what ``arbiter check`` runs).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from arbiter.config.errors import ConfigError, Problem
from arbiter.config.locate import shipped_tenants_dir
from arbiter.config.models import Rule
from arbiter.config.rulefile import RuleFile, read_rule_file
from arbiter.config.rules import KindsLookup, OptionsLookup, resolve_rules
from arbiter.config.validation import read_text

RULE_SUFFIXES = (".yaml", ".yml")


def rule_files(directories: Iterable[Path]) -> list[Path]:
    """The rule files: each path that is a file, and the rule files in each that is a
    folder, by name."""
    return [Path(name) for name, _ in rule_file_stats(directories)]


def rule_file_stats(directories: Iterable[Path]) -> list[tuple[str, os.stat_result | None]]:
    """:func:`rule_files` with each one's stat (None where it cannot be read)."""
    return RuleFileLook()(directories)


#: a folder may change again within the same tick of the clock the kernel dates it by, and
#: keep its mtime: a listing taken less than this after its mtime may miss such a change, and
#: the folder is listed again until a listing is taken later than that
RECENT_NS = 2_000_000_000
#: a listing is taken afresh at least this often, whatever the folder's stat says: a folder
#: dated by a clock that runs behind this machine's (a network filesystem's server) looks
#: older than it is, and a file added within its clock's tick would otherwise go unseen
FRESH_NS = 60_000_000_000


class _Listing(NamedTuple):
    """A folder's rule files as listed, with what says whether that listing still holds."""

    stat: tuple[int, int, int]  # the folder's mtime, inode and device then
    wall_ns: int  # when it was listed (at most), by the wall clock its mtime is compared with
    mono_ns: int  # the same by the monotonic clock, for its age
    paths: list[str]


class RuleFileLook:
    """:func:`rule_file_stats` for a caller that looks on every tick (the daemon): a folder is
    listed again only when its own stat moved (a file made, removed or renamed in it), its
    last listing came too soon after its mtime to say, or a minute ago; each rule file is
    asked its stat every time (an edit in place moves the file's, not its folder's): listing,
    naming and sorting every file on every tick would cost more than their stats."""

    def __init__(self) -> None:
        self._listed: dict[str, _Listing] = {}  # by folder

    def __call__(self, directories: Iterable[Path]) -> list[tuple[str, os.stat_result | None]]:
        files: list[tuple[str, os.stat_result | None]] = []
        listed: dict[str, _Listing] = {}
        now, now_mono = time.time_ns(), time.monotonic_ns()  # taken before any listing: never later than one
        for directory in directories:
            name = os.fspath(directory)
            try:
                st = os.stat(name)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((name, st))
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            seen = (st.st_mtime_ns, st.st_ino, st.st_dev)
            last = self._listed.get(name)
            # the listing held is trusted when it was taken well after the folder's mtime: one
            # taken within the same tick of its clock may have missed a file added after it
            if (
                last is not None
                and last.stat == seen
                and last.wall_ns - st.st_mtime_ns > RECENT_NS
                and now_mono - last.mono_ns < FRESH_NS
            ):
                listing = last
            else:
                try:
                    with os.scandir(name) as it:
                        paths = [
                            e.path
                            for e in sorted(it, key=lambda e: e.name)
                            if not e.name.startswith(".") and os.path.splitext(e.name)[1] in RULE_SUFFIXES
                        ]
                except OSError:
                    continue
                listing = _Listing(seen, now, now_mono, paths)
            listed[name] = listing
            for path in listing.paths:
                try:
                    files.append((path, os.stat(path)))
                except OSError:
                    files.append((path, None))
        self._listed = listed
        return files


def read_rule_texts(paths: Iterable[Path]) -> dict[str, str | list[Problem]]:
    """Each rule file's text, or the problems met reading it (the input of resolve_rules)."""
    out: dict[str, str | list[Problem]] = {}
    for path in paths:
        try:
            out[str(path)] = read_text(path)
        except ConfigError as exc:
            out[str(path)] = exc.problems
    return out


@dataclass
class RuleSet:
    """The rules of a set of files, and every problem found reading them."""

    rules: dict[str, Rule] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # rule id → file it came from
    problems: dict[str, list[Problem]] = field(default_factory=dict)  # file → problems

    def add(self, path: str, rule: Rule, positions_line: int = 1) -> None:
        if rule.id in self.rules:
            other = self.files[rule.id]
            self.problems.setdefault(path, []).append(
                Problem(
                    path,
                    positions_line,
                    1,
                    "id",
                    f"rule id {rule.id!r} is already used by {other}",
                    "give each rule its own id",
                )
            )
            return
        self.rules[rule.id] = rule
        self.files[rule.id] = path


def _peek(text: str | list[Problem]) -> RuleFile | None:
    """A file read as YAML, or None when it cannot be (resolve_rules reports why)."""
    if not isinstance(text, str):
        return None
    try:
        return read_rule_file(text, "")
    except ConfigError:
        return None


def with_shipped_bases(files: dict[str, str | list[Problem]]) -> set[str]:
    """Add to ``files`` the shipped default rule files that ``extends:`` may name, so that a
    rule extending one needs no folder of them in tenants_dirs; returns the names added.  They
    are bases only: a shipped rule that nothing extends is not in force (list the folder in
    tenants_dirs for that).  One whose path, file name or id a file of ``files`` has is left out."""
    shipped = shipped_tenants_dir()
    if shipped is None:
        return set()
    # one of the same name is a copy of it, even where it cannot be read now
    present = {os.path.realpath(name) for name in files} | {os.path.basename(name) for name in files}
    ids = {rf.own_id for rf in map(_peek, files.values()) if rf and rf.own_id and rf.own_id != rf.data.get("extends")}
    added: set[str] = set()
    candidates = [p for p in rule_files([shipped]) if os.path.realpath(p) not in present and p.name not in present]
    for path, text in read_rule_texts(candidates).items():
        peeked = _peek(text)
        if peeked is not None and peeked.own_id not in ids:
            files[path] = text
            added.add(path)
    return added


def check_paths(
    paths: Iterable[Path], options_for: OptionsLookup, kinds: KindsLookup, bases: Iterable[Path] = ()
) -> RuleSet:
    """Read every rule file under ``paths`` (files or directories) and collect all problems.

    ``extends:`` is followed among them and the rule files under ``bases`` (the tenants dirs,
    when single files are checked): the checked files are judged as if put beside those, each
    taking the place of one there with the same path or id.  Only rules a checked file is
    part of are reported; a problem is filed under the file it is in.
    """
    checked = rule_files(paths)
    files = read_rule_texts(checked)
    same = {os.path.realpath(p) for p in checked}
    # ids the checked files take over; one that extends the rule of its own id builds on it instead
    ids = {rf.own_id for rf in map(_peek, files.values()) if rf and rf.own_id and rf.own_id != rf.data.get("extends")}
    for path, text in read_rule_texts(p for p in rule_files(bases) if os.path.realpath(p) not in same).items():
        peeked = _peek(text)
        if peeked is not None and peeked.own_id in ids:
            continue  # the checked file with this id stands in its place
        files[path] = text
    with_shipped_bases(files)
    resolution = resolve_rules(files, options_for, kinds)
    wanted = set(map(str, checked))
    ruleset = RuleSet()
    for top in files:
        chain = resolution.chains.get(top)
        if chain is None or wanted.isdisjoint(chain):
            continue
        if top in resolution.problems:
            for problem in resolution.problems[top]:
                filed = ruleset.problems.setdefault(problem.file, [])
                if problem not in filed:  # a base extended twice is part of both extensions' rules
                    filed.append(problem)
        else:
            ruleset.add(top, resolution.rules[top])
    return ruleset
