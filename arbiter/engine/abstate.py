"""A paired ON/OFF run's spec and state, pure values: what was asked (:class:`RunSpec`), the
blocks done and left out, and the run's statistics so far (:func:`analysis`).  How a run
steps from one decision to the next is :mod:`arbiter.engine.abrun`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from arbiter.engine.abplan import Arm, WindowReading
from arbiter.engine.abstats import CONFIDENCE, Analysis, Block, analyse, blocks_within, look_confidence, planned_hours
from arbiter.engine.abwindow import Window

RunStatus = Literal["running", "done", "aborted", "refused"]
OffMode = Literal["paused", "evicted"]
#: a run that leaves out more than this many blocks per planned block is aborted
MAX_EXCLUDED_PER_BLOCK = 2
DEFAULT_LEVELS = (0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 1.0)


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    rule_id: str
    work: str = "gpu"
    duty: float | None = None  # the duty cooperative work holds in ON windows (None: as it runs)
    blocks: int = 12
    window_s: float = 300.0
    washout_s: float = 60.0
    margin: float = 0.02
    off: OffMode = "paused"
    max_hours: float = 8.0
    seed: str = ""
    pilot: int = 4
    sweep_id: str | None = None
    levels: tuple[float, ...] = ()  # a sweep's levels still to run after this one
    #: a confirmation of a twin's certificate: the published file's name (its verdict adopts
    #: or refuses that certificate; it earns none of its own)
    confirms: str = ""
    origin: str = ""  # ... and the node that earned it

    def planned_hours(self, blocks: int | None = None) -> float:
        return planned_hours(blocks or self.blocks, self.window_s)


@dataclass(frozen=True)
class BlockDone:
    attempt: int
    on_first: bool
    on_events: int
    on_s: float
    off_events: int
    off_s: float
    work_duty: float | None
    at: float  # wall clock

    @property
    def on(self) -> float:
        return self.on_events / self.on_s

    @property
    def off(self) -> float:
        return self.off_events / self.off_s


@dataclass(frozen=True)
class Excluded:
    attempt: int
    arm: Arm
    why: str
    at: float  # wall clock


@dataclass(frozen=True)
class RunState:
    spec: RunSpec
    started_wall: float
    status: RunStatus = "running"
    target: int = 0  # blocks planned (raised after the pilot, and at a first look that runs on)
    looked: int = 0  # the blocks at the first look when the run went on past it (0: it has not)
    attempt: int = 0  # the block number now
    window: Window | None = None
    first: tuple[Arm, WindowReading] | None = None  # the block's first window, done
    #: what the block's second window is compared with: (phases, pids, power) of its first
    ref: tuple[tuple[str, ...], frozenset[int], str | None] | None = None
    blocks: tuple[BlockDone, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    verdict: str = ""  # when ended: the analysis's verdict, "slowdown" (collapse), "refused", "aborted"
    certifies: bool = False
    why: str = ""
    ended_wall: float | None = None
    passed: tuple[float, ...] = ()  # a sweep: the levels passed before this run

    @property
    def running(self) -> bool:
        return self.status == "running"

    def durable(self) -> tuple[Any, ...]:
        """What a restart keeps: it changes only when a block ends or the run does."""
        return (
            self.status,
            self.target,
            self.looked,
            self.attempt,
            self.blocks,
            self.excluded,
            self.verdict,
            self.spec,
        )


def start(spec: RunSpec, wall: float, passed: tuple[float, ...] = ()) -> RunState:
    return RunState(spec=spec, started_wall=wall, target=max(spec.blocks, pilot_of(spec) + 2), passed=passed)


def pilot_of(spec: RunSpec) -> int:
    """The blocks that size the run and are left out of R (a pilot under 2 blocks sizes nothing)."""
    return spec.pilot if spec.pilot >= 2 else 0


def analysis(rs: RunState) -> Analysis | None:
    """The run's statistics so far; None until two blocks after the pilot are done."""
    pilot = pilot_of(rs.spec)
    if len(rs.blocks) < pilot + 2:
        return None
    most = blocks_within(rs.spec.max_hours, rs.spec.window_s)
    # a confirmation's length is fixed before it starts and its verdict is judged once, at the
    # usual confidence: a second look would spend error its own judgement already spends
    confidence = CONFIDENCE if rs.spec.confirms else look_confidence(rs.looked, rs.target, most)
    return analyse([Block(b.on, b.off, b.on_first) for b in rs.blocks], rs.spec.margin, pilot, confidence)
