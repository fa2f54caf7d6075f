"""What the node tells Slurm, planned from a node state and what slurmctld shows: features,
a drain with arbiter's reason once held too long, and only arbiter's own drains lifted."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from arbiter_slurm import commands, nodes

ADMITTED = {
    "gpu_apis": {"host": ["cuda", "vulkan"], "containers": []},
    "gpu_jobs_admitted": True,
    "certified_duty": {"trainer": 0.37, "game": 0.52},
    "held_since": None,
    "held_by": [],
}
HELD = {**ADMITTED, "gpu_jobs_admitted": False, "held_since": 1000.0, "held_by": [{"rule": "game", "code": "X"}]}


def view(
    available: str = "arbiter",
    active: str = "arbiter",
    state: str = "idle",
    flags: Sequence[str] = (),
    reason: str = "",
) -> nodes.NodeView:
    text = json.dumps(
        {
            "nodes": [
                {
                    "name": "n1",
                    "features": available,
                    "active_features": active,
                    "state": state,
                    "state_flags": list(flags),
                    "reason": reason,
                }
            ]
        }
    )
    return nodes.parse_node(text, "n1")


def test_features_from_the_node_state() -> None:
    assert nodes.features(ADMITTED) == ["arbiter-admit", "arbiter-api-cuda", "arbiter-api-vulkan", "arbiter-duty-30"]
    assert nodes.features({"gpu_apis": None, "gpu_jobs_admitted": False}) == []


def test_features_set_where_they_differ_and_the_operators_kept() -> None:
    (update,) = nodes.plan(view("arbiter,bigmem", "arbiter,bigmem"), ADMITTED, 0.0, 300.0)
    assert update == [
        "AvailableFeatures=arbiter,arbiter-admit,arbiter-api-cuda,arbiter-api-vulkan,arbiter-duty-30,bigmem",
        "ActiveFeatures=arbiter,arbiter-admit,arbiter-api-cuda,arbiter-api-vulkan,arbiter-duty-30,bigmem",
    ]
    done = "arbiter,arbiter-admit,arbiter-api-cuda,arbiter-api-vulkan,arbiter-duty-30,bigmem"
    assert nodes.plan(view(done, done), ADMITTED, 0.0, 300.0) == []


def test_drained_once_held_too_long_and_resumed_only_from_its_own_drain() -> None:
    current = ",".join(["arbiter", *nodes.features(HELD)])
    assert nodes.plan(view(current, current), HELD, 1299.0, 300.0) == []  # not yet
    (drain,) = nodes.plan(view(current, current), HELD, 1300.0, 300.0)
    assert drain == ["State=DRAIN", "Reason=arbiter: game X"]
    assert nodes.plan(view(current, current), HELD, 9999.0, None) == []  # draining turned off
    ours = view(current, current, flags=["DRAIN"], reason="arbiter: game X")
    assert nodes.plan(ours, HELD, 1400.0, 300.0) == []  # drained already
    admitted = ",".join(["arbiter", *nodes.features(ADMITTED)])
    assert nodes.plan(view(admitted, admitted, flags=["DRAIN"], reason="arbiter: game X"), ADMITTED, 1500.0, 300.0) == [
        ["State=RESUME"]
    ]
    operators = view(admitted, admitted, flags=["DRAIN"], reason="disk replacement")
    assert nodes.plan(operators, ADMITTED, 1500.0, 300.0) == []


def test_drain_time_from_the_environment() -> None:
    assert nodes.drain_after_s({}) == 300.0
    assert nodes.drain_after_s({"ARBITER_SLURM_DRAIN_AFTER_S": "never"}) is None
    assert nodes.drain_after_s({"ARBITER_SLURM_DRAIN_AFTER_S": "45"}) == 45.0
    with pytest.raises(commands.SlurmError, match="give seconds"):
        nodes.drain_after_s({"ARBITER_SLURM_DRAIN_AFTER_S": "5m"})


def test_a_node_slurmctld_does_not_know() -> None:
    with pytest.raises(commands.SlurmError, match="does not know node 'n9'"):
        nodes.parse_node('{"nodes": []}', "n9")
