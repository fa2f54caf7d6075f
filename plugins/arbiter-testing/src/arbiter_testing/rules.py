"""Rules that tests and bench scripts write again and again, made in one place."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def phase_during(
    events: Path | str,
    *,
    on: Sequence[str] = ("on",),
    soon: Sequence[str] = (),
    field: str = "phase",
    event: str = "status",
    scope: str | None = "gpu",
    tags: Sequence[str] = (),
) -> dict[str, Any]:
    """A rule's ``during`` entry: while the last ``event`` line of the JSONL file ``events``
    says, at ``field``, a phase in ``on`` (``soon``: one coming), GPU work of ``scope`` is
    paused (``None``: the phase is only watched)."""
    source: dict[str, Any] = {"kind": "jsonl", "path": str(events), "event": event, "field": field, "on": list(on)}
    if soon:
        source["soon"] = list(soon)
    during: dict[str, Any] = {"source": source}
    if scope is not None:
        during["pause_fleet"] = {"scope": scope}
    if tags:
        during["tags"] = list(tags)
    return during


def phase_rule(
    rule_id: str,
    marker: str,
    events: Path | str,
    *,
    on: Sequence[str] = ("on",),
    soon: Sequence[str] = (),
    field: str = "phase",
    event: str = "status",
    scope: str | None = "gpu",
    tags: Sequence[str] = (),
    immediate: bool = True,
    **more: Any,
) -> dict[str, Any]:
    """A rule (immediate unless told) for the program whose command line holds ``marker``,
    with the one :func:`phase_during` entry.  ``more`` holds the rule's other fields
    (``priority``, ``protect``...)."""
    during = phase_during(events, on=on, soon=soon, field=field, event=event, scope=scope, tags=tags)
    return {"id": rule_id, "match": {"cmdline": [marker]}, "immediate": immediate, **more, "during": [during]}


def own_sleep(number: int) -> str:
    """A ``sleep`` command line no other program on the host has, to match a rule against:
    every daemon's rules see every process, those of another run beside this one too.  GNU
    sleep adds up its arguments, and the second is this process's pid, as a fraction of a
    second."""
    return f"sleep {number} 0.{os.getpid():07d}"


def game_rule(rule_id: str, marker: str) -> dict[str, Any]:
    """A protected program that holds GPU fleet work back whenever it runs: its GPU use is not
    read (the stand-in GPU is a CPU core, which a busy machine shares)."""
    return {
        "id": rule_id,
        "match": {"cmdline": [marker]},
        "protect": {"metric": "gpu_share"},
        "pause_fleet": {"scope": "gpu"},
    }
