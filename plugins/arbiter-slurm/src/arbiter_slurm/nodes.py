"""The node in the scheduler's terms: features that say what it offers now, and a drain while
protection holds GPU work too long.

Features (``--constraint``): the static ``arbiter`` from slurm.conf, and, set at run time,
``arbiter-admit`` while GPU work is admitted, ``arbiter-api-<api>`` per usable GPU API and
``arbiter-duty-<percent>`` (the lowest certified duty, floored to 10 %).  slurmctld forgets
run-time features when it restarts or reconfigures: every sync compares what it has with what
it should have and sets them again where they differ.  Features not named ``arbiter-...``
are the operator's and are kept.

Drain: once new GPU work has been held for ``slurm.drain_after_s`` in the node config (300 s;
null turns it off), the node is drained with ``Reason="arbiter: <rule> <code>"``; when GPU work is
admitted again it is resumed, but only if the drain is arbiter's own: an operator's drain is
never lifted.

A node that starts admitting GPU work has Slurm try again, at its next scheduling pass, the
pending jobs it had given up on because no node carried the features they ask for (see
:func:`retest_pending`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from arbiter_slurm import commands

log = logging.getLogger(__name__)

PREFIX = "arbiter-"
#: the feature of a node that admits GPU work now
ADMIT = f"{PREFIX}admit"
#: squeue's reason for a pending job whose features no node has
BAD_CONSTRAINTS = "BadConstraints"
REASON_PREFIX = "arbiter:"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class NodeView:
    """What slurmctld says of one node."""

    available: tuple[str, ...]
    active: tuple[str, ...]
    state: tuple[str, ...]  # e.g. ("IDLE", "DRAIN")
    reason: str

    @property
    def drained(self) -> bool:
        return any(s in ("DRAIN", "DRAINED", "DRAINING") for s in self.state)


def features(state: dict[str, Any]) -> list[str]:
    """The run-time features for a node state (see the ``arbiter_node_state`` hook)."""
    out = []
    if state.get("gpu_jobs_admitted"):
        out.append(ADMIT)
    for api in (state.get("gpu_apis") or {}).get("host") or []:
        out.append(PREFIX + "api-" + _UNSAFE.sub("_", str(api)))
    certified = state.get("certified_duty") or {}
    if certified:
        out.append(f"{PREFIX}duty-{math.floor(min(float(d) for d in certified.values()) * 10) * 10:d}")
    return sorted(set(out))


def drain_reason(state: dict[str, Any]) -> str:
    held = state.get("held_by") or []
    what = " ".join(f"{h.get('rule') or 'node'} {h.get('code')}" for h in held[:2]) or "GPU work held"
    return f"{REASON_PREFIX} {what}"[:120]


def _names(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, list):
        return tuple(str(x) for x in raw if x)
    return tuple(f for f in str(raw or "").split(",") if f and f != "(null)")


def parse_node(text: str, node: str) -> NodeView:
    """``sinfo --json`` output (22.05 gives comma-joined strings, later releases lists)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise commands.SlurmError(f"sinfo --json printed something that is not JSON: {exc}") from None
    for n in data.get("nodes") or []:
        if n.get("name") == node:
            state = n.get("state")
            flags = n.get("state_flags") or []
            states = tuple(str(s).upper() for s in ([state] if isinstance(state, str) else state or []))
            return NodeView(
                available=_names(n.get("features")),
                active=_names(n.get("active_features")),
                state=states + tuple(str(f).upper() for f in flags),
                reason=str(n.get("reason") or ""),
            )
    raise commands.SlurmError(
        f"slurmctld does not know node {node!r} (check slurm.node in the node config, and slurm.conf)"
    )


def read_node(node: str) -> NodeView:
    return parse_node(commands.run(["sinfo", "--json", "--nodes", node]), node)


def plan(view: NodeView, state: dict[str, Any], now_wall: float, drain_after: float | None) -> list[list[str]]:
    """The ``scontrol update`` arguments that bring the node to ``state`` (none when it is)."""
    updates = []
    own = tuple(f for f in view.available if not f.startswith(PREFIX))
    wanted = features(state)
    available = sorted(set(own) | set(wanted))
    active = sorted(set(f for f in view.active if not f.startswith(PREFIX)) | set(wanted))
    if available != sorted(view.available) or active != sorted(view.active):
        updates.append([f"AvailableFeatures={','.join(available)}", f"ActiveFeatures={','.join(active)}"])
    since = state.get("held_since")
    held_long = (
        drain_after is not None
        and since is not None
        and not state.get("gpu_jobs_admitted")
        and now_wall - float(since) >= drain_after
    )
    ours = view.reason.startswith(REASON_PREFIX)
    if held_long and not view.drained:
        updates.append(["State=DRAIN", f"Reason={drain_reason(state)}"])
    elif view.drained and ours and not held_long:
        updates.append(["State=RESUME"])
    return updates


def sync(node: str, state: dict[str, Any], drain_after: float | None) -> list[list[str]]:
    """Bring the node's features and drain in line with ``state``; the updates made."""
    view = read_node(node)
    updates = plan(view, state, float(state.get("at") or time.time()), drain_after)
    for args in updates:
        commands.run(["scontrol", "update", f"NodeName={node}", *args])
    if ADMIT in features(state) and ADMIT not in view.active:
        try:
            retest_pending()
        except commands.SlurmError as exc:  # the node's features are set: Slurm's own pass places them later
            log.warning("node %s admits GPU work; having Slurm place its pending jobs now failed: %s", node, exc)
    return updates


def retest_pending() -> list[str]:
    """Have Slurm try again at its next pass to place the pending jobs that ask for arbiter's
    features and that it gave up on because no node had them (``BadConstraints``: a job requeued
    while no node admitted GPU work). Slurm gives such a job priority 0, which every scheduling pass
    skips, and gives it one again only on a periodic pass, every 30 s (``job_time_limit`` in Slurm
    22.05's ``job_mgr.c``), or when the job is updated (``_update_job``). Their start time is
    already past (Slurm says ``BeginTime`` first), so ``StartTime=now`` changes nothing else. The
    node's features are set first: a pass between the two updates then skips the job, where the
    other way round it would try the job before any node had the features and give up on it again.
    No request a client sends has slurmctld run its scheduler at once (a job update only asks for a
    pass, ``queue_job_scheduler``): the jobs start at slurmctld's next pass, within a second. The
    jobs retested."""
    keys = [
        j.key
        for j in commands.parse_squeue(commands.run(["squeue", "--json", "--states", "PENDING"]))
        if j.state == "PENDING" and j.reason == BAD_CONSTRAINTS and PREFIX in j.features
    ]
    if keys:
        commands.run(["scontrol", "update", f"JobId={','.join(keys)}", "StartTime=now"])
        log.info("node admits GPU work: Slurm places again the pending jobs %s", ", ".join(keys))
    return keys
