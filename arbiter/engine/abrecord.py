"""What a paired run leaves: its record in the store (:func:`to_record`, :func:`from_record`:
a restart keeps the blocks, never the window in progress), the duty a passing run
certifies, and the numbers its report shows beyond the blocks (:func:`summary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from arbiter.engine import codes
from arbiter.engine.abplan import exclusions_mostly_on
from arbiter.engine.abstate import BlockDone, Excluded, RunSpec, RunState, analysis
from arbiter.engine.abstats import CHANGE_CRITICAL


def certified_duty(rs: RunState) -> float | None:
    """The duty a passing run certifies: the one it asked, or, for work that holds none, the
    lowest it was measured at in an ON window (never more than the work was seen to use)."""
    if rs.spec.duty is not None:
        return rs.spec.duty
    measured = [b.work_duty for b in rs.blocks]
    if not measured or any(m is None for m in measured):
        return None
    return max(0.01, math.floor(100 * min(m for m in measured if m is not None)) / 100)


def to_record(rs: RunState) -> dict[str, Any]:
    """What a restart keeps; the window in progress, and a half-done block, are left out."""
    out = asdict(replace(rs, window=None, first=None, ref=None))
    for part in ("window", "first", "ref"):
        out.pop(part)
    return out


def from_record(rec: Mapping[str, Any]) -> RunState:
    spec = dict(rec["spec"])
    spec["levels"] = tuple(spec.get("levels") or ())
    return RunState(
        spec=RunSpec(**spec),
        started_wall=rec["started_wall"],
        status=rec["status"],
        target=rec["target"],
        looked=int(rec.get("looked") or 0),
        attempt=rec["attempt"],
        blocks=tuple(BlockDone(**b) for b in rec.get("blocks") or ()),
        excluded=tuple(Excluded(**e) for e in rec.get("excluded") or ()),
        verdict=rec.get("verdict") or "",
        certifies=bool(rec.get("certifies")),
        why=rec.get("why") or "",
        ended_wall=rec.get("ended_wall"),
        passed=tuple(rec.get("passed") or ()),
    )


@dataclass(frozen=True)
class Summary:
    """The numbers a report shows beyond the blocks."""

    analysis: dict[str, Any] | None
    mostly_on: bool
    excluded_on: int
    excluded_off: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def summary(rs: RunState) -> Summary:
    found = None
    notes: list[str] = []
    a = analysis(rs)
    if a is not None:
        found = asdict(a)
        if a.order_effect_flag:
            notes.append(
                f"the order inside blocks seems to matter (ON first minus OFF first: {a.order_effect:+.4f} in ln R)"
            )
        if a.verdict == "the effect changed":
            moved = (
                f"its change statistic {a.change:.2f} is above {CHANGE_CRITICAL:g}"
                if (a.change is not None and a.change > CHANGE_CRITICAL) or a.ends is None
                else f"R over its first {a.end_blocks} blocks {a.ends[0][0]:.4f}, over its last {a.ends[1][0]:.4f}"
            )
            notes.append(
                f"{codes.AB_EFFECT_CHANGED}: the effect changed during the run ({moved}): R is the mean of an effect"
                " that moved, so no certificate"
            )
        if a.ends_short and a.ends is not None:
            notes.append(
                f"{codes.AB_ENDS_NOT_SHOWN}: the effect over the run's first or last {a.end_blocks} blocks is not shown"
                f" within the margin (lower bounds {a.ends[0][1]:.4f} and {a.ends[1][1]:.4f}): a certificate vouches"
                " for the effect throughout the run"
            )
        if a.lag1 is not None and abs(a.lag1) > 0.5:
            notes.append(
                f"successive blocks are correlated (lag-1 autocorrelation {a.lag1:+.2f}): the program drifts,"
                f" and the interval is {a.widening:.2f} × as wide as for independent blocks"
            )
    arms = [e.arm for e in rs.excluded]
    mostly_on = exclusions_mostly_on(arms)
    if mostly_on:
        notes.append("most left-out blocks fell in ON windows: that is harm, not chance")
    return Summary(found, mostly_on, arms.count("on"), arms.count("off"), tuple(notes))


def effect_changed_note(rs: RunState | None, rule_id: str) -> list[dict[str, str]]:
    """What ``explain`` says of a rule whose last paired run withheld its certificate because
    the effect changed during the run, or its ends were not shown within the margin (empty
    otherwise): the run's R is the mean of an effect that moved, or may have, so it vouches for
    nothing."""
    if rs is None or rs.spec.rule_id != rule_id or rs.verdict not in ("the effect changed", "inconclusive"):
        return []
    show = f"`arbiter ab show {rs.spec.run_id}` shows the blocks"
    if rs.verdict == "the effect changed":
        return [
            {
                "code": codes.AB_EFFECT_CHANGED,
                "message": f"its last paired run {rs.spec.run_id} certified nothing: the effect changed during the run",
                "remedy": f"{show}; run it again once {rule_id!r} is in a steady state (after its warm-up, its cache"
                " filled)",
            }
        ]
    a = analysis(rs)
    if a is None or not a.ends_short:
        return []
    return [
        {
            "code": codes.AB_ENDS_NOT_SHOWN,
            "message": f"its last paired run {rs.spec.run_id} certified nothing: the effect over its first or last"
            f" {a.end_blocks} blocks is not shown within the margin",
            "remedy": f"{show} and both ends; run it again once {rule_id!r} is in a steady state (where its effect"
            " drifts from block to block, neither a longer --window nor a --max-hours past 48 blocks shows the ends;"
            " a larger --margin does)",
        }
    ]
