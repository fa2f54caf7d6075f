"""What a fleet scheduler is told besides admission: since when, and by what, the node has
held new GPU work back (a scheduler may drain a node held too long, naming the rule); and
what the node state observers say they published."""

from __future__ import annotations

from typing import Any

from arbiter.engine.types import Decision


class HeldSince:
    """The wall time admission last turned from yes to no; None while it is yes."""

    def __init__(self) -> None:
        self._since: float | None = None

    def update(self, admitted: bool, now_wall: float) -> float | None:
        if admitted:
            self._since = None
        elif self._since is None:
            self._since = now_wall
        return self._since


def held_by(decision: Decision | None) -> list[dict[str, Any]]:
    """What holds a new GPU job back now: each reason's rule (where it names one) and code."""
    if decision is None or decision.admits_gpu:
        return []
    # no message: its figures change from tick to tick, and a change is published at once
    return [{"rule": str(r.evidence.get("rule") or ""), "code": r.code} for r in decision.held_by]


def labels_told(answers: list[Any] | None) -> list[dict[str, Any]]:
    """The ``arbiter_node_state`` answers that say what a scheduler is told, in a fixed shape
    (an answer of another shape is left out: it is shown, never trusted to be well formed)."""
    out = []
    for answer in answers or []:
        if not isinstance(answer, dict) or not isinstance(answer.get("labels"), list):
            continue
        out.append(
            {
                "scheduler": str(answer.get("scheduler") or ""),
                "node": str(answer.get("node") or ""),
                "labels": sorted(str(label) for label in answer["labels"]),
                "error": str(answer.get("error") or ""),
            }
        )
    return sorted(out, key=lambda a: (a["scheduler"], a["node"]))
