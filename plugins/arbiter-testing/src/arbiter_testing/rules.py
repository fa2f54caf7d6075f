"""Rules that tests and bench scripts write again and again, made in one place."""

from __future__ import annotations

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
