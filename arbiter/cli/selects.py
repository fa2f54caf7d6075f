"""``arbiter rules [ID]``: what each rule is once ``extends:`` is followed, which processes its
``match:`` selects now, and the near misses with the field that missed.

It needs no daemon: it reads the rule files and the process table itself, with the daemon's
matchers and its claiming order (a process belongs to the first rule, highest priority first,
whose matcher selects it).  Run as another account than the daemon's, it may see less of
other users' processes (their working directory, their executable) than the daemon does.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from arbiter.config.loader import (
    read_rule_texts,
    resolve_rules,
    rule_files,
    validate_kind_options,
    with_shipped_bases,
)
from arbiter.config.models import NodeConfig, Rule
from arbiter.daemon.claim import Claimer
from arbiter.daemon.rules import LiveRule
from arbiter.plugin import Matcher, ProcessInfo
from arbiter.pluginmanager import PluginFailed, PluginHost

#: how many near misses a rule shows, and how alike a process must look to be one
NEAR_MISSES = 5
NEAR_RATIO = 0.7


@dataclass
class Selection:
    """One rule: its effective form and what it selects."""

    rule: Rule
    file: str
    chain: list[str]  # the files it is made of, base first
    selected: list[ProcessInfo] = field(default_factory=list)
    #: processes its matcher selects that a rule of higher priority claimed first: (process, that rule)
    taken: list[tuple[ProcessInfo, str]] = field(default_factory=list)
    near: list[tuple[ProcessInfo, list[str]]] = field(default_factory=list)  # (process, the fields it missed)
    fault: str = ""

    def effective(self) -> str:
        return yaml.safe_dump(self.rule.model_dump(mode="json", exclude_unset=True), sort_keys=False)

    def to_dict(self) -> dict[str, Any]:
        def proc(p: ProcessInfo) -> dict[str, Any]:
            return {"pid": p.pid, "name": p.name, "cmdline": list(p.cmdline), "user": p.username or p.uid}

        return {
            "id": self.rule.id,
            "file": self.file,
            "files": self.chain,
            "rule": self.rule.model_dump(mode="json", exclude_unset=True),
            "selects": [proc(p) for p in self.selected],
            "claimed_first_by": [{**proc(p), "rule": other} for p, other in self.taken],
            "near_misses": [{**proc(p), "missed": missed} for p, missed in self.near],
            "fault": self.fault,
        }


@dataclass
class Book:
    selections: list[Selection]
    problems: list[str]  # files whose rule does not load, each with its first problem


def _matcher(host: PluginHost, rule: Rule) -> Matcher:
    info = host.kind("matchers", rule.match.kind)
    if info is None:
        raise PluginFailed(f"matchers/{rule.match.kind}", "no installed plugin registers this kind")
    options = validate_kind_options(rule.match, info.cls.Options)
    matcher: Matcher = host.call(f"matchers/{rule.match.kind}", info.cls, options)
    return matcher


def _own_line(table: list[ProcessInfo]) -> set[int]:
    """This command and the processes above it (a shell, a launcher): never a program's."""
    parent = {p.pid: p.ppid for p in table}
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        pid = parent.get(pid, 0)
    return pids


def _words(rule: Rule) -> list[str]:
    """The texts a ``match:`` block looks for (what a near miss resembles)."""
    out: list[str] = []
    for key, value in rule.match.options().items():
        if key in ("tree", "user"):
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str):
                out.append(v.lower())
    return out


def _likeness(words: list[str], p: ProcessInfo) -> tuple[float, str, str]:
    """How much a process looks like what the rule names: the best likeness of one of its
    words to the process's name, one of its arguments or an argument's file name, with that
    word and that part."""
    parts = {p.name}
    for arg in p.cmdline:
        parts.update((arg, arg.rsplit("/", 1)[-1]))
    parts.discard("")
    best = (0.0, "", "")
    for w in words:
        for part in parts:
            if w in part.lower():
                return (1.0, w, part)
            best = max(best, (difflib.SequenceMatcher(None, w, part.lower()).ratio(), w, part))
    return best


def read_book(config: NodeConfig, host: PluginHost) -> Book:
    files = read_rule_texts(rule_files(config.tenants_paths()))
    shipped = with_shipped_bases(files)
    resolution = resolve_rules(files, host.options_model, host.kind_names)
    selections, problems = [], []
    for name in files:
        if name in shipped:
            continue
        if name in resolution.problems:
            problems.append(f"{name}: {resolution.problems[name][0]}")
            continue
        rule = resolution.rules.get(name)
        if rule is not None and rule.enabled:
            selections.append(Selection(rule, name, resolution.chains.get(name, [name])))
    selections.sort(key=lambda s: (-s.rule.priority, s.rule.id))  # the daemon's claiming order
    return Book(selections, problems)


def match_now(book: Book, host: PluginHost, table: list[ProcessInfo]) -> None:
    """Fill each selection from one process table, as the daemon's tick claims it."""
    own = _own_line(table)
    candidates = [p for p in table if p.pid not in own]
    lives: list[LiveRule] = []
    for sel in book.selections:
        live = LiveRule(sel.rule, sel.file)
        try:
            live.matcher = _matcher(host, sel.rule)
        except (PluginFailed, ValueError) as exc:
            sel.fault = str(exc)
        lives.append(live)
    claimed, faults = Claimer(host.call).claim([live for live in lives if live.matcher is not None], candidates)
    owner = {pid: rid for rid, pids in claimed.items() for pid in pids}
    for sel, live in zip(book.selections, lives, strict=True):
        if live.matcher is None:
            continue
        sel.fault = sel.fault or "; ".join(faults.get(sel.rule.id, []))
        mine = claimed.get(sel.rule.id, frozenset())
        sel.selected = [p for p in candidates if p.pid in mine]
        try:
            alone = host.call(f"matchers/{sel.rule.match.kind}", live.matcher.select, candidates)
        except PluginFailed as exc:
            sel.fault = sel.fault or str(exc)
            continue
        sel.taken = [(p, owner[p.pid]) for p in candidates if p.pid in alone and owner.get(p.pid) != sel.rule.id]
        words = _words(sel.rule)
        ranked = sorted(
            ((_likeness(words, p), p) for p in candidates if p.pid not in alone),
            key=lambda lp: -lp[0][0],
        )
        for (likeness, word, part), p in ranked[:NEAR_MISSES]:
            if likeness < NEAR_RATIO:
                break
            try:
                missed = list(host.call(f"matchers/{sel.rule.match.kind} misses", live.matcher.misses, p))
            except PluginFailed:
                missed = []
            if likeness < 1.0:
                missed.append(f"closest to {word!r}: {part!r}")
            sel.near.append((p, missed or ["match: its matcher does not say which field"]))


def process_table(host: PluginHost) -> list[ProcessInfo]:
    table = host.call("process table", lambda: host.hook.arbiter_process_table(scratch={}))
    if table is None:
        raise PluginFailed("process table", "no installed plugin provides arbiter_process_table")
    return list(table)


def _line(p: ProcessInfo) -> str:
    shown = " ".join(p.cmdline) or p.name
    return f"pid {p.pid} ({p.username or p.uid}): {shown[:160]}"


def print_book(console: Any, book: Book, rule_id: str | None) -> None:
    from rich.table import Table
    from rich.text import Text

    for problem in book.problems:
        console.print(Text(f"does not load: {problem}", style="red"))
    if rule_id is None:
        table = Table(title="Rules (claiming order)")
        for col in ("rule", "prio", "file", "selects now", "near misses"):
            table.add_column(col, overflow="fold")
        for sel in book.selections:
            selects = ", ".join(str(p.pid) for p in sel.selected) or ("-" if not sel.fault else sel.fault)
            table.add_row(
                sel.rule.id, str(sel.rule.priority), sel.file, selects, str(len(sel.near)) if sel.near else ""
            )
        console.print(table)
        console.print("`arbiter rules ID` shows a rule's effective form and what its match: selects, or misses.")
        return
    sel = next(s for s in book.selections if s.rule.id == rule_id)
    for part in sel.chain:
        console.print(Text(f"# {part}", style="dim"))
    if len(sel.chain) > 1:
        console.print(Text("# the rule in force, its base's fields merged with those extending it:", style="dim"))
    console.print(sel.effective().rstrip(), markup=False, highlight=False)
    if sel.fault:
        console.print(Text(f"its matcher fails: {sel.fault}", style="red"))
    console.print(Text("\nselects now:", style="bold"))
    for p in sel.selected:
        console.print(f"  {_line(p)}", markup=False, highlight=False)
    if not sel.selected:
        console.print("  no process")
    for p, other in sel.taken:
        console.print(f"  {_line(p)}: claimed first by rule {other!r} (higher priority)", markup=False)
    if sel.near:
        console.print(Text("near misses (processes that look like it, and the field that missed):", style="bold"))
        for p, missed in sel.near:
            console.print(f"  {_line(p)}", markup=False, highlight=False)
            for why in missed:
                mark = "→" if why.startswith("closest") else "✗"
                console.print(Text(f"    {mark} {why}", style="yellow"), markup=False)
    elif not sel.selected:
        console.print("  and no process looks like what match: names")


def show_rules(config: str | None, rule_id: str | None, as_json: bool) -> None:
    """``arbiter rules [ID]``: each rule, or one, as :func:`print_book` shows it (or JSON)."""
    from arbiter.cli.client import CliError, config_or_the_running_ones
    from arbiter.cli.common import console_out, fail, node_and_plugins, print_json

    try:
        config = config_or_the_running_ones(config)
    except CliError as exc:
        raise fail(exc) from None
    cfg, host = node_and_plugins(config)
    book = read_book(cfg, host)
    if rule_id is not None and all(s.rule.id != rule_id for s in book.selections):
        known = [s.rule.id for s in book.selections]
        near = difflib.get_close_matches(rule_id, known, 1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (rules: {', '.join(known) or 'none'})"
        raise fail(CliError(f"no rule in force has id {rule_id!r}{hint}", 2))
    try:
        match_now(book, host, process_table(host))
    except PluginFailed as exc:
        raise fail(CliError(f"cannot read the process table: {exc}", 1)) from None
    if as_json:
        print_json({"rules": [s.to_dict() for s in book.selections if rule_id in (None, s.rule.id)]})
    else:
        print_book(console_out(), book, rule_id)
