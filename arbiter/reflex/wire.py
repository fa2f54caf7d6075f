"""The messages between the daemon and the reflex process, typed, and their JSON lines.

The daemon sends :class:`Setup` once, then :class:`Sources` whenever the phase sources of
the immediate rules change and an :class:`Arm` after each decision; the process answers each
reading of a source with a :class:`Reading` (what it read, whether it was armed for it and
what it paused and resumed), or once with :class:`Fatal` when it cannot start.  Each side
encodes with ``encode`` and decodes with the function for what it receives; a line that is
not one of these raises :class:`ValueError`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from arbiter.plugin import JobTarget, ProcessRef, SourceState
from arbiter.state.journal import PausedEntry

Slot = tuple[str, int, int]  # rule id, source index, rule serial


def arm_key(rule_id: str, index: int, serial: int) -> str:
    """A source's key in an arm (JSON keys are strings): a rule loaded anew is armed anew."""
    return f"{rule_id}\t{index}\t{serial}"


@dataclass(frozen=True)
class Setup:
    """What the process loads: the plugins (those with source kinds, the pause translator's
    and those that give fast-path threads a hint), the node config's plugin sections as the
    daemon validated them, the pause translator, the journal and the lock file."""

    plugins: list[str]
    disable: list[str]
    only: list[str]
    timeout_s: float
    state_dir: str
    stand_in_gpu: bool
    sections: dict[str, Any]
    translator: str
    journal: str
    lock: str = ""


@dataclass(frozen=True)
class SourceSpec:
    """A phase source of an immediate rule, for the process to watch with the same plugin."""

    rule: str
    index: int
    serial: int
    kind: str
    options: dict[str, Any]

    @property
    def slot(self) -> Slot:
        return (self.rule, self.index, self.serial)


@dataclass(frozen=True)
class Sources:
    specs: tuple[SourceSpec, ...]


@dataclass(frozen=True)
class Moves:
    """What the process does on one phase value of one source: pause these jobs (the one
    using the most GPU time first) and resume these paused entries."""

    pause: tuple[JobTarget, ...] = ()
    resume: tuple[PausedEntry, ...] = ()


#: per source (:func:`arm_key`), per phase value (on, off), its moves
ArmTable = dict[str, dict[str, Moves]]


@dataclass(frozen=True)
class Arm:
    number: int
    slots: ArmTable


@dataclass(frozen=True)
class Reading:
    """The process's word on one reading of a source.  ``state`` None: it cannot watch that
    source (``why`` says why), and the daemon's own watcher reads it."""

    slot: Slot
    state: SourceState | None = None
    why: str = ""
    #: None: no phase change to act on; else whether an arm covered it
    armed: bool | None = None
    did: tuple[tuple[str, tuple[PausedEntry, ...]], ...] = ()
    #: of what it paused, the entries whose pause the translator could not confirm
    unconfirmed: tuple[PausedEntry, ...] = ()
    locked_at: float | None = None
    first_at: float | None = None
    acted_at: float | None = None
    #: what the host said of the source's thread, once
    thread: str | None = None
    #: set by the daemon's end: from a process since given up (what it did counts, its reading does not)
    stale: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Fatal:
    why: str


ToProcess = Setup | Sources | Arm
ToDaemon = Reading | Fatal


#: a reading's fields, named once: its line is written on the fast path, where ``asdict``
#: (a deep copy of every value) cost more than the rest of the line
_STATE_FIELDS = tuple(f.name for f in fields(SourceState))


def _target(t: JobTarget) -> list[Any]:
    return [t.job_id, t.name, [[r.pid, r.start_time] for r in t.processes]]


def encode(message: ToProcess | ToDaemon) -> bytes:
    """One JSON line."""
    data: dict[str, Any]
    if isinstance(message, Setup):
        data = {"setup": asdict(message)}
    elif isinstance(message, Sources):
        data = {"sources": [[s.rule, s.index, s.serial, s.kind, s.options] for s in message.specs]}
    elif isinstance(message, Arm):
        data = {
            "arm": message.number,
            "slots": {
                key: {
                    phase: [[_target(t) for t in m.pause], [e.fields() for e in m.resume]] for phase, m in moves.items()
                }
                for key, moves in message.slots.items()
            },
        }
    elif isinstance(message, Fatal):
        data = {"fatal": message.why}
    else:
        data = {"slot": list(message.slot)}
        if message.state is None:
            data.update(covered=False, why=message.why)
        else:
            state = message.state
            data["state"] = {name: getattr(state, name) for name in _STATE_FIELDS}
        if message.armed is not None:
            data["armed"] = message.armed
            if message.why:
                data["why"] = message.why
        if message.did:
            data["did"] = [[op, [e.fields() for e in entries]] for op, entries in message.did]
            data["unconfirmed"] = [e.fields() for e in message.unconfirmed]
        for at in ("locked_at", "first_at", "acted_at", "thread"):
            if getattr(message, at) is not None:
                data[at] = getattr(message, at)
    return (json.dumps(data) + "\n").encode()


def to_process(raw: bytes | str) -> ToProcess:
    """What the daemon sent."""
    data = json.loads(raw)
    if "setup" in data:
        return Setup(**data["setup"])
    if "sources" in data:
        return Sources(tuple(SourceSpec(*s) for s in data["sources"]))
    if "arm" in data:
        return Arm(
            int(data["arm"]),
            {
                key: {
                    phase: Moves(
                        tuple(JobTarget(jid, name, tuple(ProcessRef(*r) for r in refs)) for jid, name, refs in pause),
                        tuple(PausedEntry(*row) for row in resume),
                    )
                    for phase, (pause, resume) in moves.items()
                }
                for key, moves in data["slots"].items()
            },
        )
    raise ValueError(f"not a message for the reflex process: {str(raw)[:80]!r}")


def to_daemon(raw: bytes | str) -> ToDaemon:
    """What the process sent."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"not a line of the reflex process: {str(raw)[:80]!r}")
    if "fatal" in data:
        return Fatal(str(data["fatal"]))
    rid, index, serial = data["slot"]
    raw_state = data.get("state")
    state = None if raw_state is None else SourceState(**{**raw_state, "models": tuple(raw_state["models"])})
    return Reading(
        slot=(rid, index, serial),
        state=state,
        why=str(data.get("why", "")),
        armed=data.get("armed"),
        did=tuple((op, tuple(PausedEntry(*row) for row in rows)) for op, rows in data.get("did", ())),
        unconfirmed=tuple(PausedEntry(*row) for row in data.get("unconfirmed", ())),
        locked_at=data.get("locked_at"),
        first_at=data.get("first_at"),
        acted_at=data.get("acted_at"),
        thread=data.get("thread"),
    )
