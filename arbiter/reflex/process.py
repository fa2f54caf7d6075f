"""The reflex process: a phase change's pauses and resumes, out of the daemon's interpreter.

The daemon's threads share one interpreter lock, and under load (a tick scanning a thousand
processes, a source counting ten thousand lines a second, decisions over a hundred rules)
a phase change waited for it at every step on its way to the first signal: the fast path's
p99 doubled.  This process has an interpreter of its own and nothing else to do.

The daemon starts it (``python -m arbiter.reflex.process``) and sends it, as lines on its
standard input (the typed messages of :mod:`arbiter.reflex.wire`):

- a :class:`~arbiter.reflex.wire.Setup` once: the plugins to load (those with source kinds,
  the pause translator's, and those that give fast-path threads a hint: no others, for
  memory), the state folder, the pause translator and the journal and lock files;
- :class:`~arbiter.reflex.wire.Sources`: the phase sources of the immediate rules, whenever
  they change; it watches each with the same source plugin;
- an :class:`~arbiter.reflex.wire.Arm` after each decision: per source and phase value (on,
  off), the jobs to pause (their process refs) or the paused entries to resume: what the
  daemon's own reflex would do from that decision (see :mod:`arbiter.engine.reflex`).

On each reading of a source it acts on the arm for a phase that changed (the journal row
first, as the daemon does), then writes one :class:`~arbiter.reflex.wire.Reading` to its
standard output: the reading, whether it was armed for it, and what it paused and resumed.  The daemon takes these
lines in order, as the readings of those sources, and records what was done; its decision
still has the last word.

Both processes signal jobs only while holding ``flock`` on the lock file, and each writes
there how many messages it has sent (the daemon's arms at byte 0, this process's lines at
byte 8): whoever takes the lock first waits until it has read everything the other sent
under it, so the arm is never older than the last act, nor the daemon's record than the
last reflex.  The process exits when its standard input closes (the daemon is gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import queue
import signal
import struct
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from arbiter.plugin import PROJECT, PluginContext, Source, SourceState
from arbiter.pluginmanager import PluginHost, build_plugin_manager
from arbiter.reflex.act import Actuator
from arbiter.reflex.limits import cap_malloc_arenas
from arbiter.reflex.wire import (
    Arm,
    ArmTable,
    Fatal,
    Reading,
    Setup,
    Slot,
    Sources,
    SourceSpec,
    ToProcess,
    arm_key,
    encode,
    to_process,
)
from arbiter.state.journal import PausedEntry, PausedJournal

#: where each side writes the count of messages it sent, in the lock file
ARMS_AT, LINES_AT = 0, 8
#: how long one side waits for the other's messages it was told of
CATCH_UP_S = 1.0
#: the interpreter's switch interval here (the default is 5 ms)
SWITCH_S = 0.0005


def read_count(fd: int, at: int) -> int:
    raw = os.pread(fd, 8, at)
    return struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0


def write_count(fd: int, at: int, value: int) -> None:
    os.pwrite(fd, struct.pack("<Q", value), at)


class ReflexHost:
    def __init__(self, setup: Setup, out: Any) -> None:
        self.out = out
        only = set(setup.only)
        others = [ep.name for ep in entry_points(group=PROJECT) if ep.name not in only]
        self.host: PluginHost = build_plugin_manager(
            [m for m in setup.plugins if m in only], [*setup.disable, *others], timeout_s=setup.timeout_s
        )
        # the plugin sections as the daemon validated them, for the plugins loaded here
        sections = {
            n: self.host.sections[n].model.model_validate(v)
            for n, v in setup.sections.items()
            if n in self.host.sections
        }
        self.context: dict[str, Any] = dict(
            state_dir=setup.state_dir, stand_in_gpu=setup.stand_in_gpu, daemon_uid=os.geteuid(), sections=sections
        )
        self.lock_fd = os.open(setup.lock, os.O_RDWR | os.O_CREAT, 0o600)
        name = setup.translator
        info = self.host.kind("translators", name)
        if info is None:
            raise ValueError(f"the pause translator {name!r} is not installed here")
        translator = info.cls(info.cls.Options(), PluginContext(**self.context))
        if not translator.bounded:
            raise ValueError(f"the pause translator {name!r} does not bound its own time")
        self.done: list[tuple[str, list[PausedEntry]]] = []  # what the actuator's last call did
        self.actuator = Actuator(
            self.host,
            {"pause": (name, translator)},
            PausedJournal(Path(setup.journal)),
            lambda op, entries: self.done.append((op, list(entries))),
        )
        self.sources: dict[Slot, Source] = {}
        self.specs: dict[Slot, SourceSpec] = {}
        self.keys: dict[Slot, str] = {}  # each watched source's key in an arm, made once
        self.last_phase: dict[Slot, str] = {}
        self.arm: ArmTable = {}
        self.armed = 0
        self.armed_cv = threading.Condition()
        self.lines = 0
        # one reading at a time, from taking the lock to its line sent: the flock is the
        # process's, so it keeps the daemon out but not this process's other threads
        self.acting = threading.Lock()
        self.asked = threading.local()  # a source's thread asked the host for a core sooner
        # sources start and stop on a thread of their own: their first readings wait for the
        # lock, and the thread reading the daemon's messages must not (an arm may be on its way)
        self.wanted: queue.Queue[tuple[SourceSpec, ...]] = queue.Queue()
        threading.Thread(target=self._sync_loop, name="sources", daemon=True).start()

    # --- from the daemon ---------------------------------------------------------------------

    def take(self, message: ToProcess) -> None:
        if isinstance(message, Sources):
            self.wanted.put(message.specs)
        elif isinstance(message, Arm):
            arm = message.slots
            self.actuator.prepare([t for moves in arm.values() for m in moves.values() for t in m.pause])
            with self.armed_cv:
                # the arm before its number: ``act`` reads them without the condition
                self.arm = arm
                self.armed = message.number
                self.armed_cv.notify_all()

    def _sync_loop(self) -> None:
        while True:
            self.sync(self.wanted.get())

    def sync(self, wanted: tuple[SourceSpec, ...]) -> None:
        by_slot = {spec.slot: spec for spec in wanted}
        for slot in [s for s in self.sources if by_slot.get(s) != self.specs.get(s)]:
            source = self.sources.pop(slot)
            self.specs.pop(slot, None)
            self.keys.pop(slot, None)
            self.last_phase.pop(slot, None)
            try:
                source.close()
            except Exception:
                pass
        for slot, spec in by_slot.items():
            if slot not in self.sources:
                self.start(spec)

    def start(self, spec: SourceSpec) -> None:
        slot, rid, kind, options = spec.slot, spec.rule, spec.kind, spec.options
        try:
            info = self.host.kind("sources", kind)
            if info is None:
                raise ValueError(f"no installed plugin registers the source kind {kind!r} here")
            model_cls = info.cls.Options
            model = model_cls.model_validate({**options, "kind": kind} if "kind" in model_cls.model_fields else options)
            source: Source = info.cls(model, PluginContext(**self.context, rule_id=rid))
            self.sources[slot] = source
            self.specs[slot] = spec
            self.keys[slot] = arm_key(*slot)
            source.start(lambda state: self.reading(slot, state))
            self.reading(slot, source.state(), first=True)
        except Exception as exc:
            self.specs.pop(slot, None)
            started = self.sources.pop(slot, None)
            if started is not None:
                with contextlib.suppress(Exception):
                    started.close()
            with self.acting:
                self.send(Reading(slot, why=f"{type(exc).__name__}: {exc}"))

    # --- a source's reading ------------------------------------------------------------------

    def reading(self, slot: Slot, state: SourceState, first: bool = False) -> None:
        """On the source's thread: act on a phase change (not on the first reading: the
        decision the arm comes from has seen that one), then tell the daemon, whatever
        happened: it takes these lines as the source's readings."""
        if slot not in self.specs:
            return  # a source closed meanwhile
        with self.acting:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            try:
                line: dict[str, Any] = {}
                try:
                    if not first and not getattr(self.asked, "done", False):
                        self.asked.done = True
                        line["thread"] = self.host.fast_thread(f"source {slot[0]}/during.{slot[1]}")
                    phase = state.phase if state.readable else None
                    if phase in ("on", "off"):
                        before, self.last_phase[slot] = self.last_phase.get(slot), phase
                        if before is not None and phase != before:
                            line.update(self.act(slot, phase))
                except Exception as exc:
                    line.update({"armed": False, "why": f"{type(exc).__name__}: {exc}"})
                    line.update(self.did())
                self.send(Reading(slot, state, **line))
            finally:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def act(self, slot: Slot, phase: str) -> dict[str, Any]:
        """What the arm says for this phase, done; under the lock.

        From the reading to the first signal only what the signal needs is done: the arm
        is a table made when it came, looked up by the source's key made when it started.
        What is told afterwards waits for the first job paused to stop."""
        locked_at = time.monotonic()
        wanted = read_count(self.lock_fd, ARMS_AT)
        # ``take`` sets the arm before its number: a number seen here is never ahead of the arm
        if self.armed < wanted:
            with self.armed_cv:
                if not self.armed_cv.wait_for(lambda: self.armed >= wanted, timeout=CATCH_UP_S):
                    return {"armed": False, "why": "the daemon's last arm did not arrive"}
        moves = self.arm.get(self.keys.get(slot) or arm_key(*slot))
        if moves is None:
            return {"armed": False}
        pause, resume = moves[phase].pause, moves[phase].resume
        self.done.clear()
        self.actuator.paused.clear()  # the daemon keeps the record; each act starts afresh
        self.actuator.unconfirmed.clear()
        # the job taking the most GPU time is paused first, alone (see Actuator.pause_in_turn),
        # and the first job to resume is resumed alone too: the others' signals wake fifty
        # processes at once.  The job paused first is waited for right after its signal: the
        # records made next, and the line this act ends with, which wakes the daemon, whose
        # decision on it takes a core; on a busy host the job then waited for one to stop
        first_at = self.actuator.pause_in_turn(pause, alone_too=True)
        resumed_at = self.actuator.resume_in_turn(resume)
        first_at = first_at or resumed_at
        acted_at = time.monotonic()
        return {
            "armed": True,
            **self.did(),
            "locked_at": locked_at,
            "first_at": first_at or acted_at,
            "acted_at": acted_at,
        }

    def did(self) -> dict[str, Any]:
        """What the last act changed: the daemon takes it into its record (a pause that
        failed stays unconfirmed there, to be tried again)."""
        did = tuple((op, tuple(entries)) for op, entries in self.done if entries)
        self.done.clear()
        unconfirmed = tuple(e for e in self.actuator.paused.values() if e.key in self.actuator.unconfirmed)
        return {"did": did, "unconfirmed": unconfirmed} if did else {}

    def send(self, line: Reading) -> None:
        """Under ``acting`` (or before any source runs)."""
        self.out.write(encode(line).decode())
        self.out.flush()
        self.lines += 1
        write_count(self.lock_fd, LINES_AT, self.lines)


def main() -> None:
    # The daemon's terminal's ^C is the daemon's to act on: it stops this process itself,
    # which ends when its input does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp = sys.stdin
    # the lines to the daemon go to a descriptor of their own: what a plugin, a library or
    # a child process writes to standard output goes to standard error
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # a source's thread waits at most this long for the interpreter while an arm is read
    sys.setswitchinterval(SWITCH_S)
    cap_malloc_arenas()
    first = inp.readline()
    if not first:
        return
    try:
        setup = to_process(first)
        if not isinstance(setup, Setup):
            raise ValueError(f"its first message is a {type(setup).__name__}, not its setup")
        host = ReflexHost(setup, out)
    except Exception as exc:
        out.write(encode(Fatal(f"it could not start: {type(exc).__name__}: {exc}")).decode())
        out.flush()
        raise SystemExit(1) from exc
    # What start-up made (modules, plugins) lives as long as the process: out of the
    # collector's sight, a full collection, which holds the interpreter and so a reading
    # being acted on, walks only what the arms made since.
    gc.freeze()
    for raw in inp:
        host.take(to_process(raw))
    # the daemon is gone or stopping: a reading being acted on ends and is told first
    host.acting.acquire(timeout=CATCH_UP_S)
    os._exit(0)


if __name__ == "__main__":
    main()
