"""The rules in force: rule files read, validated, kept at their last good version, and
their plugin instances (matcher, sources) created and replaced on reload."""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from arbiter.config.errors import Problem
from arbiter.config.loader import (
    Resolution,
    RuleFileLook,
    read_rule_texts,
    resolve_rules,
    rule_files,
    validate_kind_options,
    with_shipped_bases,
)
from arbiter.config.models import KindBlock, MatchBlock, NodeConfig, Rule
from arbiter.daemon.sources import BUSY
from arbiter.engine import codes
from arbiter.engine.handoff import GIB
from arbiter.engine.types import CompliancePolicy, DuringPolicy, GovernorPolicy, Policy, RulePolicy
from arbiter.plugin import Checkpoint, Matcher, PluginContext, SecretRef, Source, SourceState, Translator
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.state.store import Store

#: (rule id, during index or -1 for progress, new state) — called from a source's thread
SourceCallback = Callable[[str, int, SourceState], None]
Record = Callable[[str, str, str, dict[str, Any]], None]
SendCheck = Callable[[str, Mapping[str, str | SecretRef]], str | None]

log = logging.getLogger("arbiter.rules")


@dataclass
class LiveRule:
    """A rule in force, with the plugin instances that serve it."""

    rule: Rule
    path: str
    serial: int = 0  # which loading this is: each gets a new one
    matcher: Matcher | None = None
    progress: Source | None = None
    phases: list[Source | None] = field(default_factory=list)
    #: sources that watch processes (index → the matcher of their match block)
    source_matchers: dict[int, Matcher] = field(default_factory=dict)
    busy: Source | None = None  # its busy probe
    events: Source | None = None  # its wake-ups: any change re-probes ``busy`` now
    release: Translator | None = None  # asks it to give VRAM back
    reacquire: Translator | None = None  # asks it to take that VRAM back (wakes it)
    profile: Translator | None = None  # its GPU profile while it works on the GPU
    faults: list[str] = field(default_factory=list)  # instances that could not be made

    def sources(self) -> list[tuple[int, KindBlock, Source | None]]:
        """(index, block, instance) of each source: index -1 is progress, 0… the phases."""
        out: list[tuple[int, KindBlock, Source | None]] = []
        if self.rule.protect and self.rule.protect.source:
            out.append((-1, self.rule.protect.source, self.progress))
        out.extend(
            (i, d.source, self.phases[i] if i < len(self.phases) else None) for i, d in enumerate(self.rule.during)
        )
        if self.rule.busy:
            out.append((BUSY, self.rule.busy, self.busy))
        return out

    def wake_busy(self, host: PluginHost) -> None:
        """Have the busy probe read again now (it wakes its own thread; this never blocks)."""
        if self.busy is None or self.rule.busy is None:
            return
        try:
            host.call(f"sources/{self.rule.busy.kind} refresh", self.busy.refresh, timeout=1)
        except PluginFailed:
            pass  # its own next poll, and the tick's reading, still come

    def close(self, host: PluginHost) -> None:
        for inst in [
            self.matcher,
            self.progress,
            *self.phases,
            *self.source_matchers.values(),
            self.busy,
            self.events,
            self.release,
            self.reacquire,
            self.profile,
        ]:
            if inst is not None:
                try:
                    host.call(f"close {self.rule.id}", inst.close, timeout=2)
                except PluginFailed:
                    pass


Signature = tuple[tuple[str, int, int, int, int], ...]


def _signature(paths: list[Path], look: RuleFileLook | None = None) -> Signature:
    """Every rule file with its mtime, size, inode and change time (read on every tick, through
    ``look``): a file moved over a rule keeping its size and its mtime (``cp -p``, ``rsync -t``,
    ``tar x``) is another inode, or changed at another time."""
    found = (look or RuleFileLook())(paths)
    return tuple(
        (name, st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns) if st else (name, -1, -1, -1, -1)
        for name, st in found
    )


class RuleBook:
    def __init__(
        self,
        config: NodeConfig,
        host: PluginHost,
        store: Store | None,
        on_source: SourceCallback,
        record: Record,
        pause_frees_vram: bool = False,
        may_send: Callable[[str], SendCheck] | None = None,
    ) -> None:
        """:param pause_frees_vram: the pause translator gives a paused job's VRAM back, so the
        handoff may take a running job's memory by pausing it.
        :param may_send: a rule id → the check its plugins make before they send headers or an
        action (:class:`arbiter.daemon.endpoints.Endpoints`)."""
        self.may_send = may_send
        self.pause_frees_vram = pause_frees_vram
        self.config = config
        self.host = host
        self.store = store
        self.on_source = on_source
        self.record = record
        self.live: dict[str, LiveRule] = {}
        self.invalid_files: list[str] = []  # files never valid: they hold GPU work
        self.problems: dict[str, list[Problem]] = {}
        self._last_good: dict[str, str] = store.last_good_rule_files() if store else {}
        self._signature: Signature | None = None
        self._look = RuleFileLook()  # the tick's look at the rule files
        self.generation = 0  # grows each time the rules in force change (helpers ask again)
        self._serials = itertools.count(1)

    # --- reading ------------------------------------------------------------------------------

    def changed(self) -> bool:
        return _signature(self.config.tenants_paths(), self._look) != self._signature

    def _resolve(self, files: Mapping[str, str | list[Problem]]) -> Resolution:
        return resolve_rules(files, self.host.options_model, self.host.kind_names)

    def load(self) -> bool:
        """Read every rule file again; returns True when the rules in force changed.

        The files are resolved together (``extends:`` reaches across them).  A file whose rule
        fails, through its own problems or its base's, keeps the rule that the last good
        versions of the files it is made of give."""
        self._signature = _signature(self.config.tenants_paths(), self._look)
        files = read_rule_texts(rule_files(self.config.tenants_paths()))
        shipped = with_shipped_bases(files)  # bases for extends: only, not rules in force
        now = self._resolve(files)
        fallback: Resolution | None = None
        if now.problems:
            # Every file of a failing rule as it last was good (a file never good is left out,
            # so that a new file extending a base twice cannot take the base's rule away too).
            involved = {part for name in now.problems for part in now.chains.get(name, [name])}
            world = {name: text for name, text in files.items() if name not in involved}
            world.update(
                {name: self._last_good[name] for name in files if name in involved and name in self._last_good}
            )
            fallback = self._resolve(world)
        rules: dict[str, tuple[Rule, str]] = {}
        invalid: list[str] = []
        problems: dict[str, list[Problem]] = {}
        for name in files:
            if name in shipped:
                continue
            rule = now.rules.get(name)
            found = now.problems.get(name)
            if found:
                problems[name] = found
                kept = fallback.rules.get(name) if fallback else None
                # a base whose last good version an extension's last good version replaces
                replaced = fallback is not None and fallback.extended.get(name) in fallback.rules
                summary = str(found[0]) + (f" (+{len(found) - 1} more)" if len(found) > 1 else "")
                fresh = [str(p) for p in self.problems.get(name, [])] != [str(p) for p in found]
                if kept is not None or replaced:
                    rule = kept
                    if fresh:
                        self.record(
                            codes.CONFIG_REJECTED,
                            name,
                            f"kept the last good version: {summary}",
                            {"problems": [p.to_dict() for p in found]},
                        )
                else:
                    invalid.append(name)
                    if fresh:
                        self.record(
                            codes.CONFIG_REJECTED,
                            name,
                            f"never valid, GPU work held: {summary}",
                            {"problems": [p.to_dict() for p in found]},
                        )
                    continue
            elif rule is not None:
                for part in now.chains.get(name, [name]):
                    text = files[part]
                    if isinstance(text, str) and self._last_good.get(part) != text:
                        self._last_good[part] = text
                        if self.store is not None:
                            try:
                                self.store.save_rule_file(part, text)
                            except (sqlite3.Error, OSError) as exc:
                                # kept in memory: a full or read-only disk must not stop the rules loading
                                log.error("cannot keep the last good version of %s: %s", part, exc)
            if rule is None:
                continue  # a base: the rule of the file extending it stands in its place
            if rule.id in rules:
                other = rules[rule.id][1]
                problems.setdefault(name, []).append(
                    Problem(
                        name, 1, 1, "id", f"rule id {rule.id!r} is already used by {other}", "give each rule its own id"
                    )
                )
                invalid.append(name)
                continue
            rules[rule.id] = (rule, name)
        self.problems = problems
        self.invalid_files = invalid
        return self._apply(rules)

    def _apply(self, rules: dict[str, tuple[Rule, str]]) -> bool:
        changed = False
        for rid in list(self.live):
            if rid not in rules or rules[rid][0] != self.live[rid].rule or not rules[rid][0].enabled:
                gone = self.live.pop(rid)
                gone.close(self.host)
                changed = True
                if rid not in rules or not rules[rid][0].enabled:
                    why = "disabled (enabled: false)" if rid in rules else "its file is gone or no longer defines it"
                    self.record(
                        codes.CONFIG_RELOADED,
                        rid,
                        f"rule {rid!r} unloaded from {gone.path}: {why}",
                        {"file": gone.path},
                    )
        for rid, (rule, path) in rules.items():
            if rid in self.live or not rule.enabled:
                continue
            self.live[rid] = self._instantiate(rule, path)
            self.record(codes.CONFIG_RELOADED, rid, f"rule {rid!r} loaded from {path}", {"file": path})
            changed = True
        if changed:
            self.generation += 1
        return changed

    # --- instances ----------------------------------------------------------------------------

    def _context(self, rule: Rule) -> PluginContext:
        check = self.may_send(rule.id) if self.may_send is not None else None
        return self.host.context(self.config, rule_id=rule.id, may_send=check)

    def _make(self, family: str, block: KindBlock, rule: Rule) -> Any:
        info = self.host.kind(family, block.kind)
        if info is None:
            raise PluginFailed(f"{family}/{block.kind}", "no installed plugin registers this kind")
        options = validate_kind_options(block, info.cls.Options)
        if family == "matchers":
            return self.host.call(f"matchers/{block.kind}", info.cls, options)
        return self.host.call(f"{family}/{block.kind}", info.cls, options, self._context(rule))

    def _instantiate(self, rule: Rule, path: str) -> LiveRule:
        live = LiveRule(rule, path, next(self._serials))
        try:
            live.matcher = self._make("matchers", rule.match, rule)
        except (PluginFailed, ValueError) as exc:
            live.faults.append(f"match: {exc}")
        if rule.protect and rule.protect.source:
            live.progress = self._start_source(live, rule.protect.source, -1, "protect.source")
        for i, during in enumerate(rule.during):
            live.phases.append(self._start_source(live, during.source, i, f"during.{i}.source"))
        if rule.busy:
            live.busy = self._start_source(live, rule.busy, BUSY, "busy")
        if rule.events:
            live.events = self._start_wakeups(live, rule.events)
        for attr in ("release", "reacquire", "profile"):
            block = getattr(rule, attr)
            if block is not None:
                try:
                    setattr(live, attr, self._make("translators", block, rule))
                except (PluginFailed, ValueError) as exc:
                    live.faults.append(f"{attr}: {exc}")
        for fault in live.faults:
            self.record(codes.PLUGIN_FAILED, rule.id, f"rule {rule.id!r}: {fault}; treated as harm", {"fault": fault})
        return live

    def _start_source(self, live: LiveRule, block: KindBlock, index: int, where: str) -> Source | None:
        rid = live.rule.id
        try:
            source: Source = self._make("sources", block, live.rule)
            option = type(source).match_option
            if option is not None:
                match = MatchBlock.model_validate(getattr(source.options, option))
                live.source_matchers[index] = self._make("matchers", match, live.rule)
            self.host.call(f"sources/{block.kind} start", source.start, lambda state: self.on_source(rid, index, state))
            return source
        except (PluginFailed, ValueError) as exc:
            live.faults.append(f"{where}: {exc}")
            return None

    def _start_wakeups(self, live: LiveRule, block: KindBlock) -> Source | None:
        """An ``events:`` source only wakes the busy probe up (re-probe now); it is never harm."""
        try:
            source: Source = self._make("sources", block, live.rule)
            self.host.call(f"sources/{block.kind} start", source.start, lambda _state: live.wake_busy(self.host))
            return source
        except (PluginFailed, ValueError) as exc:
            live.faults.append(f"events: {exc}")
            return None

    def checkpoint(self, rule_id: str) -> Checkpoint | None:
        """How the jobs this rule's protection evicts save their work (its ``eviction:``
        settings), None where it says nothing."""
        live = self.live.get(rule_id)
        given = live.rule.eviction if live is not None else None
        return None if given is None else Checkpoint(given.checkpoint_signal, given.checkpoint_s)

    def policy(self) -> Policy:
        """The node config's policy with the rules as loaded now."""
        c = self.config
        base = Policy(
            gpu_jobs=c.gpu_jobs,
            busy_threshold=c.gpu_busy_threshold,
            release_after_s=c.gpu_release_after_s,
            stop_grace_s=c.stop_grace_s,
            evict_after_s=c.evict_after_s,
            evict_cost_s=c.evict_cost_s,
            compliance=CompliancePolicy(**c.compliance.model_dump()),
            governor=GovernorPolicy(**c.governor.model_dump(), min_available=c.memory_guard.min_available),
            pause_frees_vram=self.pause_frees_vram,
        )
        rules = {}
        for rid, live in self.live.items():
            r = live.rule
            release = r.release.options() if r.release else {}  # timeout_s and confirm
            wake = r.reacquire.options() if r.reacquire else {}
            rules[rid] = RulePolicy(
                rule_id=rid,
                priority=r.priority,
                protected=r.protected,
                immediate=r.immediate,
                pause_fleet=r.pause_fleet.scope if r.pause_fleet else None,
                during=tuple(DuringPolicy(d.pause_fleet.scope, tuple(d.tags)) for d in r.during),
                progress=bool(r.protect and r.protect.source),
                max_slowdown=r.protect.max_slowdown if r.protect else 0.05,
                reclaimable=live.release is not None,  # a release block whose translator loaded
                busy_probe=r.busy is not None,
                needs_vram_bytes=None if r.needs_vram_gb is None else int(r.needs_vram_gb * GIB),
                idle_release_after_s=r.idle_release_after_s,
                release_timeout_s=float(release.get("timeout_s", RulePolicy.release_timeout_s)),
                confirm=bool(release.get("confirm", RulePolicy.confirm)),
                reacquire=live.reacquire is not None and live.release is not None,
                reacquire_after_s=r.reacquire_after_s,
                reacquire_timeout_s=float(wake.get("timeout_s", RulePolicy.reacquire_timeout_s)),
                reacquire_confirm=bool(wake.get("confirm", RulePolicy.reacquire_confirm)),
                release_when_busy=r.release_when_busy,
                drain_timeout_s=r.drain_timeout_s,
                profile=r.profile is not None,
            )
        return replace(base, rules=rules)

    def ordered(self) -> list[LiveRule]:
        """Rules in the order processes are given to them: highest priority first."""
        # dict() copies in one step: other threads read while the tick thread reloads
        return sorted(dict(self.live).values(), key=lambda lr: (-lr.rule.priority, lr.rule.id))

    def close(self) -> None:
        for live in self.live.values():
            live.close(self.host)
        self.live.clear()
