"""Applying actions through translators, and remembering what is paused.

Every pause is written to the journal before it happens, so a daemon killed at any moment
leaves a record from which the next start (or ``arbiter resume-all``) resumes it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from arbiter.plugin import ControlUpdate, JobTarget, ProcessRef, Translator
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.state.journal import PausedEntry, PausedJournal

if TYPE_CHECKING:  # not imported at run time: the reflex process uses this module, and is kept small
    from arbiter.config.models import NodeConfig
    from arbiter.engine.types import Action

T = TypeVar("T")
ACTION_NEEDS = {
    "pause": "pause",
    "resume": "pause",
    "control": "control",
    "terminate": "terminate",
    "kill": "terminate",
}
#: how long the job paused first may take to stop before the others are signalled: a phase
#: must reach them within a millisecond or two as well
FIRST_STOP_S = 0.001
#: called with (op, entries) after each change to the paused set, to persist it off this thread
Persist = Callable[[str, Sequence[PausedEntry]], None]


@dataclass
class ActResult:
    action: Action
    ok: bool
    detail: str = ""


def default_translators(host: PluginHost, need: str) -> list[str]:
    """The installed translators that declare ``need``, in the order the daemon tries them
    when the node config names none: by rank, then by name."""
    kinds = host.translators()
    able = [name for name, info in kinds.items() if need in info.cls.actions]
    return sorted(able, key=lambda name: (kinds[name].cls.rank, name))


def make_translators(
    config: NodeConfig,
    host: PluginHost,
    pid_reused: Callable[[str, ProcessRef, str], None] | None = None,
    note: Callable[[str, str, str, dict[str, Any]], None] | None = None,
) -> dict[str, tuple[str, Translator]]:
    """Per need (pause, control, terminate), the translator that serves it.

    ``translators:`` in the node config names kinds in order; otherwise every installed
    translator that declares the action, by its ``rank`` (then its name).  The first that
    says it is available here wins.  ``pid_reused`` hears of each recorded process a translator left
    alone because its pid now names another process; ``note`` hears what an action did that
    the timeline shows (a pause that freed a job's VRAM).
    """
    context = host.context(config, pid_reused=pid_reused, note=note)
    chosen: dict[str, tuple[str, Translator]] = {}
    made: dict[str, Translator] = {}
    for need in ("pause", "control", "terminate"):
        names = config.translators.get(need) or default_translators(host, need)
        for name in names:
            info = host.kind("translators", name)
            if info is None or need not in info.cls.actions:
                continue
            try:
                if name not in made:
                    made[name] = host.call(f"translators/{name}", info.cls, info.cls.Options(), context)
                ok, _why = host.call(f"translators/{name}", made[name].available)
            except PluginFailed:
                continue
            if ok:
                chosen[need] = (name, made[name])
                break
    return chosen


class Actuator:
    """Applies actions and keeps the paused set (in memory, the journal and, via ``persist``,
    SQLite).  Runs on the decision thread, or alone in ``resume-all``."""

    def __init__(
        self, host: PluginHost, translators: dict[str, tuple[str, Translator]], journal: PausedJournal, persist: Persist
    ) -> None:
        self.host = host
        self.translators = translators
        self.by_name = {name: t for name, t in translators.values()}
        self.journal = journal
        self.persist = persist
        self.paused: dict[tuple[str, str, int], PausedEntry] = {}
        self.unconfirmed: set[tuple[str, str, int]] = set()  # on record, but their pause failed
        # id(target) -> (that target, its entries, their journal rows): see prepare()
        self._prepared: dict[int, tuple[JobTarget, list[PausedEntry], str]] = {}

    def _translator(self, op: str) -> tuple[str, Translator]:
        need = ACTION_NEEDS[op]
        if need not in self.translators:
            raise PluginFailed(f"translators ({need})", f"no installed translator can {need} here")
        return self.translators[need]

    def _for_entry(self, entry: PausedEntry, op: str) -> tuple[str, Translator]:
        """The translator that paused ``entry`` resumes it, where it is still installed."""
        if entry.translator in self.by_name:
            return entry.translator, self.by_name[entry.translator]
        return self._translator(op)

    def _call(self, translator: Translator, label: str, fn: Callable[..., T], *args: Any) -> T:
        """A pause or a resume: on this thread where the translator bounds its own time."""
        call = self.host.call_here if translator.bounded else self.host.call
        return call(label, fn, *args)

    def _note(self, op: str, entries: Sequence[PausedEntry]) -> None:
        if not entries:
            return
        self.journal.append_many(op, entries)
        self.adopt(op, entries)

    def adopt(self, op: str, entries: Sequence[PausedEntry], unconfirmed: Iterable[PausedEntry] = ()) -> None:
        """Take into the paused set what another process paused or resumed (its journal rows
        are written; see arbiter.reflex.process); ``unconfirmed``: of those paused, the ones whose
        pause failed (a later pause tries them again)."""
        for entry in entries:
            if op == "pause":
                self.paused[entry.key] = entry
            else:
                self.paused.pop(entry.key, None)
            self.unconfirmed.discard(entry.key)
        self.unconfirmed.update(e.key for e in unconfirmed if e.key in self.paused)
        if entries:
            self.persist(op, entries)

    def pause_effect(self, job_id: str) -> str:
        """What the pause of ``job_id`` stops and frees, as the translators that paused it say
        ("" where it is not paused, or they say nothing).  Called off the decision thread: it
        reads a copy of the paused set."""
        said: list[str] = []
        by_translator: dict[str, list[ProcessRef]] = {}
        for e in list(self.paused.values()):
            if e.job_id == job_id:
                by_translator.setdefault(e.translator, []).append(ProcessRef(e.pid, e.start_time))
        for name, refs in by_translator.items():
            translator = self.by_name.get(name)
            if translator is None:
                continue
            try:
                said.append(translator.pause_effect(refs))
            except Exception:  # a plugin's answer for explain must not fail the view
                continue
        return "; ".join(s for s in said if s)

    def trees_paused(self) -> dict[str, list[PausedEntry]]:
        """Each job's paused processes, in one pass (a decision asks for every job's)."""
        out: dict[str, list[PausedEntry]] = {}
        for e in self.paused.values():
            if e.how == "tree":
                out.setdefault(e.job_id, []).append(e)
        return out

    def apply(self, action: Action, target: JobTarget, seq: int) -> ActResult:
        """A control document, a terminate or a kill (pauses and resumes of process trees go
        in batches: :meth:`pause_trees`, :meth:`resume_entries`)."""
        try:
            if action.op == "control":
                self.control(target, ControlUpdate(action.state or "run", action.duty, action.reason), seq)
            elif action.op in ("terminate", "kill"):
                name, translator = self._translator(action.op)
                self.host.call(f"translators/{name}", getattr(translator, action.op), target)
            else:
                raise ValueError(f"{action.op} is applied in batches, not through apply()")
        except PluginFailed as exc:
            return ActResult(action, False, str(exc))
        return ActResult(action, True)

    def prepare(self, targets: Iterable[JobTarget]) -> None:
        """Make the paused entries and journal rows of each target now, after a decision, for
        the next one's :meth:`pause_trees` to find (a phase pausing fifty jobs would make them
        on its way to the first signal); those of other targets are forgotten."""
        if "pause" not in self.translators:
            return
        self._prepared = {id(t): self._made(t) for t in targets}  # read from the old one while made

    def _made(self, target: JobTarget) -> tuple[JobTarget, list[PausedEntry], str]:
        """``target``, its entries and their journal rows: as prepared, or made now."""
        made = self._prepared.get(id(target))
        if made is not None and made[0] is target:  # an id is reused once its target is gone
            return made
        name = self.translators["pause"][0]  # the translators are fixed for the actuator's life
        entries = [PausedEntry(target.job_id, "tree", r.pid, r.start_time, name) for r in target.processes]
        return target, entries, PausedJournal.rows(entries)

    def pause_trees(
        self, targets: Sequence[JobTarget], first_paused: Callable[[], None] | None = None
    ) -> dict[str, PluginFailed]:
        """Pause the processes of each target not paused yet (new children too), all in one
        translator call: a phase that pauses fifty jobs must not wait for fifty hand-offs to
        a plugin thread.  Returns, per job whose pause failed, why.  ``first_paused`` is
        called once the translator has paused the first target without failing, before any
        record is made."""
        todo: list[JobTarget] = []
        paused = self.trees_paused() if self.paused else {}
        for target in targets:
            mine = paused.get(target.job_id)
            if mine:
                # a pause that failed is kept on record (for a resume) but is tried again here
                done = {e.pid for e in mine if e.key not in self.unconfirmed}
                fresh = tuple(r for r in target.processes if r.pid not in done)
                if len(fresh) < len(target.processes):
                    target = replace(target, processes=fresh)
            if target.processes:
                todo.append(target)
        if not todo:
            return {}
        try:
            name, translator = self._translator("pause")
        except PluginFailed as exc:
            return {target.job_id: exc for target in todo}
        made = [self._made(t) for t in todo]
        work = [(t, entries) for t, entries, _ in made]
        # recorded before the pause: a crash in between must not leave it frozen
        self.journal.append_rows("pause", [rows for _, _, rows in made])
        label = f"translators/{name}"

        def pause_all() -> list[list[ProcessRef] | BaseException]:
            out: list[list[ProcessRef] | BaseException] = []
            for target, _ in work:
                try:
                    out.append(translator.pause(target))
                except Exception as exc:
                    out.append(exc)
            return out

        try:
            results = self._call(translator, label, pause_all)
        except PluginFailed as exc:  # it hung, or failed outside any one job's pause
            results = [exc] * len(work)
        if (
            first_paused is not None
            and work[0][0].job_id == targets[0].job_id
            and not isinstance(results[0], BaseException)
        ):
            first_paused()
        failed: dict[str, PluginFailed] = {}
        kept: list[PausedEntry] = []  # on record now (paused, or perhaps paused by a failed call)
        gone: list[PausedEntry] = []  # not paused after all (their process had ended)
        dropped: list[PausedEntry] = []  # of those, ones an earlier try had kept on record
        for (target, entries), result in zip(work, results, strict=True):
            if isinstance(result, BaseException):
                # some may be stopped already: keep them all on record, so a resume reaches them
                kept.extend(entries)
                self.unconfirmed.update(e.key for e in entries)
                failed[target.job_id] = (
                    result
                    if isinstance(result, PluginFailed)
                    else PluginFailed(label, f"{type(result).__name__}: {result}")
                )
                continue
            stopped = {r.pid for r in result}
            for entry in entries:
                self.unconfirmed.discard(entry.key)
                if entry.pid in stopped:
                    kept.append(entry)
                else:
                    gone.append(entry)
                    if self.paused.pop(entry.key, None) is not None:  # a retried pause that found it gone
                        dropped.append(entry)
        # after every signal is sent: the records cost nothing on the way to the pauses
        for entry in kept:
            self.paused[entry.key] = entry
        if gone:
            self.journal.append_many("resume", gone)
        if kept:
            self.persist("pause", kept)
        if dropped:
            self.persist("resume", dropped)
        return failed

    def pause_in_turn(self, targets: Iterable[JobTarget], alone_too: bool = False) -> float | None:
        """A phase's pauses: the first target (the job taking the most GPU time) alone, then,
        once it has stopped or :data:`FIRST_STOP_S` has passed, the others in one batch.
        Each signal wakes its target, which must run once to stop: fifty of them woken at
        once kept the first waiting for a core.  ``targets`` may be lazy: the others are
        made while the first stops.  A first pause that failed, even in part, is not waited
        for.  ``alone_too``: the first is waited for even where it is alone, right after its
        signal, before its record is made (the reflex process: what it does next, down to
        the line that wakes the daemon, would take the core the job needs to stop).  Returns
        when the first was signalled (``time.monotonic()``), None for no targets.  Failures
        stay on record for the decision that follows to try again and report."""
        them = iter(targets)
        first = next(them, None)
        if first is None:
            return None
        signalled: list[float] = []

        def first_paused() -> None:
            signalled.append(time.monotonic())
            if alone_too:
                self.settle(first, signalled[0])

        failed = self.pause_trees([first], first_paused)
        first_at = signalled[0] if signalled else time.monotonic()
        rest = list(them)
        if rest and not failed and not alone_too:
            self.settle(first, first_at)
        if rest:
            self.pause_trees(rest)
        return first_at

    def settle(self, target: JobTarget, since: float) -> None:
        """Wait until the processes of ``target`` (paused at ``since``) have stopped, at most
        until :data:`FIRST_STOP_S` after ``since``: a stopped process must run once to stop,
        and work begun meanwhile takes the core it needs.  Only a translator that bounds its
        own time may wait on this thread; with any other it returns at once."""
        pausing = self.translators.get("pause")
        if pausing is None or not pausing[1].bounded:
            return
        name, translator = pausing
        left = max(FIRST_STOP_S - (time.monotonic() - since), 0.0)
        with contextlib.suppress(PluginFailed):  # a settle that fails only ends the wait
            self.host.call_here(f"translators/{name}", translator.settle, target.processes, left)

    def resume_in_turn(self, entries: Sequence[PausedEntry]) -> float | None:
        """A phase's resumes: the first entry's job alone, then the others (their signals
        wake fifty processes at once).  Returns when the first was resumed
        (``time.monotonic()``), None for no entries."""
        lead = entries[0].job_id if entries else None
        first_at = None
        for batch in ([e for e in entries if e.job_id == lead], [e for e in entries if e.job_id != lead]):
            if batch:
                self.resume_entries(batch)
                first_at = first_at or time.monotonic()
        return first_at

    def resume_entries(self, entries: Iterable[PausedEntry]) -> list[str]:
        """Resume what was paused; returns what could not be (and why).  What failed stays
        in the paused set, so the next decision (or the next start) tries again."""
        failures = []
        by_translator: dict[str, list[PausedEntry]] = {}
        for e in entries:
            if e.how == "tree":
                by_translator.setdefault(e.translator, []).append(e)
        for group in by_translator.values():
            try:
                name, translator = self._for_entry(group[0], "resume")
                self._call(
                    translator,
                    f"translators/{name}",
                    translator.resume,
                    [ProcessRef(e.pid, e.start_time) for e in group],
                )
                self._note("resume", group)
            except PluginFailed as exc:
                failures.append(str(exc))
        for e in [e for e in entries if e.how == "control"]:
            try:
                target = JobTarget(e.job_id, "", (ProcessRef(e.pid, e.start_time),), e.control_path, cooperative=True)
                name, translator = self._for_entry(e, "control")
                update = ControlUpdate("run", 1.0, "arbiter resumed it")
                self.host.call(f"translators/{name}", translator.control, target, update, next_seq(e.control_path))
                self._note("resume", [e])
            except PluginFailed as exc:
                failures.append(str(exc))
        return failures

    def control(self, target: JobTarget, update: ControlUpdate, seq: int) -> None:
        name, translator = self._translator("control")
        root = target.processes[0] if target.processes else ProcessRef(0, 0.0)
        entry = PausedEntry(target.job_id, "control", root.pid, root.start_time, name, target.control_path)
        if update.state == "paused":
            self._note("pause", [entry])
        self.host.call(f"translators/{name}", translator.control, target, update, seq)
        if update.state != "paused":
            self._note("resume", [e for e in self.paused.values() if e.job_id == target.job_id and e.how == "control"])

    def end_job(self, job_id: str) -> list[str]:
        """A job ended: continue whatever of it is still paused (descendants may outlive it)."""
        mine = [e for e in self.paused.values() if e.job_id == job_id]
        failures = self.resume_entries([e for e in mine if e.how == "tree"])
        # nobody reads the document of an ended job
        self._note("resume", [e for e in mine if e.how == "control" and e.key in self.paused])
        return failures


def next_seq(control_path: str | None, known: int = 0) -> int:
    """A sequence number above both ``known`` and the one in the document, so a write is
    never ignored as stale (the document may have been written by an earlier daemon)."""
    current = 0
    if control_path:
        try:
            with open(control_path) as fh:
                current = int(json.load(fh).get("seq", 0))
        except (OSError, ValueError, AttributeError, TypeError):
            current = 0
    return max(current, known) + 1
