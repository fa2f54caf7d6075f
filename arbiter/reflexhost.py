"""The reflex process: a phase change's pauses and resumes, out of the daemon's interpreter.

The daemon's threads share one interpreter lock, and under load (a tick scanning a thousand
processes, a source counting ten thousand lines a second, decisions over a hundred rules)
a phase change waited for it at every step on its way to the first signal: the fast path's
p99 doubled.  This process has an interpreter of its own and nothing else to do.

The daemon starts it (``python -m arbiter.reflexhost``) and sends it, as JSON lines on its
standard input:

- ``{"setup": ...}`` once: the plugins to load (those with source kinds, the pause
  translator's, and those that give fast-path threads a hint: no others, for memory), the
  state folder, the pause translator and the journal and lock files;
- ``{"sources": [[rule, index, serial, kind, options], ...]}``: the phase sources of the
  immediate rules, whenever they change; it watches each with the same source plugin;
- ``{"arm": n, "slots": ...}``: after each decision, per source and phase value (on, off),
  the jobs to pause (their process refs) or the paused entries to resume: what the
  daemon's own reflex would do from that decision (see :mod:`arbiter.engine.reflex`).

On each reading of a source it acts on the arm for a phase that changed (the journal row
first, as the daemon does), then writes one line to its standard output: the reading,
whether it was armed for it, and what it paused and resumed.  The daemon takes these
lines in order, as the readings of those sources, and records what was done; its decision
still has the last word.

Both processes signal jobs only while holding ``flock`` on the lock file, and each writes
there how many messages it has sent (the daemon's arms at byte 0, this process's lines at
byte 8): whoever takes the lock first waits until it has read everything the other sent
under it, so the arm is never older than the last act, nor the daemon's record than the
last reflex.  The process exits when its standard input closes (the daemon is gone).
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import sys
import threading
import time
from dataclasses import asdict
from importlib.metadata import entry_points
from typing import Any

from arbiter.daemon.act import Actuator
from arbiter.plugin import JobTarget, PluginContext, ProcessRef, Source, SourceState
from arbiter.pluginmanager import PROJECT, PluginHost, build_plugin_manager
from arbiter.store import PausedEntry, PausedJournal

#: where each side writes the count of messages it sent, in the lock file
ARMS_AT, LINES_AT = 0, 8
#: how long one side waits for the other's messages it was told of
CATCH_UP_S = 1.0
#: the interpreter's switch interval here (the default is 5 ms)
SWITCH_S = 0.0005

Slot = tuple[str, int, int]  # rule id, source index, rule serial


def arm_key(rule_id: str, index: int) -> str:
    """A source's key in an arm (JSON keys are strings)."""
    return f"{rule_id}\t{index}"


def read_count(fd: int, at: int) -> int:
    raw = os.pread(fd, 8, at)
    return struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0


def write_count(fd: int, at: int, value: int) -> None:
    os.pwrite(fd, struct.pack("<Q", value), at)


class ReflexHost:
    def __init__(self, setup: dict[str, Any], out: Any) -> None:
        self.out = out
        only = set(setup["only"])
        others = [ep.name for ep in entry_points(group=PROJECT) if ep.name not in only]
        self.host: PluginHost = build_plugin_manager([m for m in setup["plugins"] if m in only], [*setup["disable"], *others],
                                                     timeout_s=setup["timeout_s"])
        self.context = dict(state_dir=setup["state_dir"], stand_in_gpu=setup["stand_in_gpu"], daemon_uid=os.geteuid())
        self.lock_fd = os.open(setup["lock"], os.O_RDWR | os.O_CREAT, 0o600)
        name = setup["translator"]
        info = self.host.kind("translators", name)
        if info is None:
            raise SystemExit(f"the pause translator {name!r} is not installed here")
        translator = info.cls(info.cls.Options(), PluginContext(**self.context))  # type: ignore[attr-defined]
        if not translator.bounded:
            raise SystemExit(f"the pause translator {name!r} does not bound its own time")
        self.done: list[tuple[str, list[PausedEntry]]] = []  # what the actuator's last call did
        self.actuator = Actuator(self.host, {"pause": (name, translator)}, PausedJournal(setup["journal"]),
                                 lambda op, entries: self.done.append((op, list(entries))))
        self.sources: dict[Slot, Source] = {}
        self.specs: dict[Slot, list[Any]] = {}
        self.last_phase: dict[Slot, str] = {}
        self.arm: dict[str, dict[str, Any]] = {}
        self.armed = 0
        self.armed_cv = threading.Condition()
        self.lines = 0
        self.out_lock = threading.Lock()
        self.asked = threading.local()  # a source's thread asked the host for a core sooner

    # --- from the daemon ---------------------------------------------------------------------

    def take(self, message: dict[str, Any]) -> None:
        if "sources" in message:
            self.sync([tuple(s) for s in message["sources"]])
        elif "arm" in message:
            arm = {key: {phase: ([JobTarget(jid, name, tuple(ProcessRef(*r) for r in refs)) for jid, name, refs in pause],
                                 [PausedEntry(*row) for row in resume])
                         for phase, (pause, resume) in moves.items()}
                   for key, moves in message["slots"].items()}
            self.actuator.prepare([t for moves in arm.values() for pause, _ in moves.values() for t in pause])
            with self.armed_cv:
                self.arm, self.armed = arm, message["arm"]
                self.armed_cv.notify_all()

    def sync(self, wanted: list[Any]) -> None:
        by_slot = {(rid, index, serial): [kind, options] for rid, index, serial, kind, options in wanted}
        for slot in [s for s in self.sources if by_slot.get(s) != self.specs.get(s)]:
            source = self.sources.pop(slot)
            self.specs.pop(slot, None)
            self.last_phase.pop(slot, None)
            try:
                source.close()
            except Exception:  # noqa: BLE001 - a source that fails to close is dropped all the same
                pass
        for slot, (kind, options) in by_slot.items():
            if slot not in self.sources:
                self.start(slot, kind, options)

    def start(self, slot: Slot, kind: str, options: dict[str, Any]) -> None:
        rid, index, serial = slot
        try:
            info = self.host.kind("sources", kind)
            if info is None:
                raise ValueError(f"no installed plugin registers the source kind {kind!r} here")
            model_cls = info.cls.Options  # type: ignore[attr-defined]
            model = model_cls.model_validate({**options, "kind": kind} if "kind" in model_cls.model_fields else options)
            source: Source = info.cls(model, PluginContext(**self.context, rule_id=rid))
            self.sources[slot] = source
            self.specs[slot] = [kind, options]
            source.start(lambda state: self.reading(slot, state))
            self.reading(slot, source.state())
        except Exception as exc:  # noqa: BLE001 - the daemon watches this source itself
            self.sources.pop(slot, None)
            self.specs.pop(slot, None)
            self.send({"slot": [rid, index, serial], "covered": False, "why": f"{type(exc).__name__}: {exc}"})

    # --- a source's reading ------------------------------------------------------------------

    def reading(self, slot: Slot, state: SourceState) -> None:
        """On the source's thread: act on a phase change (not on the first reading: the
        decision the arm comes from has seen that one), then tell the daemon."""
        if slot not in self.specs:
            return  # a source closed meanwhile
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            line: dict[str, Any] = {"slot": list(slot), "state": asdict(state)}
            if not getattr(self.asked, "done", False) and threading.current_thread() is not threading.main_thread():
                self.asked.done = True
                line["thread"] = self.host.fast_thread(f"source {slot[0]}/during.{slot[1]}")
            phase = state.phase if state.readable else None
            if phase in ("on", "off"):
                before, self.last_phase[slot] = self.last_phase.get(slot), phase
                if before is not None and phase != before:
                    line.update(self.act(slot, phase))
            self.send(line)
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def act(self, slot: Slot, phase: str) -> dict[str, Any]:
        """What the arm says for this phase, done; under the lock."""
        locked_at = time.monotonic()
        wanted = read_count(self.lock_fd, ARMS_AT)
        with self.armed_cv:
            if not self.armed_cv.wait_for(lambda: self.armed >= wanted, timeout=CATCH_UP_S):
                return {"armed": False, "why": "the daemon's last arm did not arrive"}
            moves = self.arm.get(arm_key(slot[0], slot[1]))
        if moves is None:
            return {"armed": False}
        pause, resume = moves[phase]
        self.done.clear()
        self.actuator.paused.clear()  # the daemon keeps the record; each act starts afresh
        self.actuator.unconfirmed.clear()
        # the job taking the most GPU time comes first, alone (see the daemon's reflex)
        for batch in (pause[:1], pause[1:]):
            if batch:
                self.actuator.pause_trees(batch)
        if resume:
            self.actuator.resume_entries(resume)
        did = [[op, [e.fields() for e in entries]] for op, entries in self.done if entries]
        return {"armed": True, "did": did, "locked_at": locked_at, "acted_at": time.monotonic()}

    def send(self, line: dict[str, Any]) -> None:
        with self.out_lock:
            self.out.write(json.dumps(line) + "\n")
            self.out.flush()
            self.lines += 1
            write_count(self.lock_fd, LINES_AT, self.lines)


def main() -> None:
    inp = sys.stdin
    out = sys.stdout
    sys.stdout = sys.stderr  # a plugin's print must not corrupt the lines to the daemon
    # a source's thread waits at most this long for the interpreter while an arm is read
    sys.setswitchinterval(SWITCH_S)
    first = inp.readline()
    if not first:
        return
    host = ReflexHost(json.loads(first)["setup"], out)
    for raw in inp:
        host.take(json.loads(raw))
    os._exit(0)  # the daemon is gone: source threads are not waited for


if __name__ == "__main__":
    main()
