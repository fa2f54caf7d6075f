"""What the node tells Slurm, planned from a node state and what slurmctld shows: features,
a drain with arbiter's reason once held too long, and only arbiter's own drains lifted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from arbiter.cli.nodecheck import node_problems
from arbiter.config.loader import load_node_config
from arbiter.pluginmanager import build_plugin_manager
from arbiter_slurm import commands, nodes, settings

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


def sections(tmp_path: Path, body: str) -> tuple[dict[str, Any], list[str]]:
    """The node config's plugin sections as the daemon gets them, and its problems as text."""
    path = tmp_path / "arbiter.yaml"
    path.write_text(f"state_dir: {tmp_path}\n{body}")
    cfg, _ = load_node_config(path)
    host = build_plugin_manager()
    try:
        problems = [str(p) for p in node_problems(cfg, path, host)]
        return ({} if problems else dict(host.context(cfg).sections)), problems
    finally:
        host.close()


def test_the_node_and_drain_time_come_from_the_slurm_section(tmp_path: Path) -> None:
    given, _ = sections(tmp_path, "slurm:\n  node: n7\n  drain_after_s: 45\n")
    assert given["slurm"] == settings.NodeOptions(node="n7", drain_after_s=45.0)
    assert settings.node_name(given["slurm"]) == "n7"
    given, _ = sections(tmp_path, "slurm: {drain_after_s: null}\n")
    assert given["slurm"].drain_after_s is None  # never drained
    given, _ = sections(tmp_path, "")
    assert given["slurm"] == settings.NodeOptions()  # the defaults: the host's name, 300 s
    assert given["slurm"].drain_after_s == 300.0


def test_a_wrong_slurm_section_is_refused_at_its_line(tmp_path: Path) -> None:
    _, problems = sections(tmp_path, "slurm:\n  node: n7\n  drain_after: 45\n")
    assert problems == [
        f"{tmp_path}/arbiter.yaml:4:3: slurm.drain_after: unknown key 'drain_after' "
        "(did you mean 'drain_after_s'? known keys here: checkpoint_s, checkpoint_signal, drain_after_s, node, requeue_grace_s)"
    ], problems
    _, problems = sections(tmp_path, "slurm:\n  drain_after_s: 5m\n")
    assert len(problems) == 1 and "arbiter.yaml:3:18: slurm.drain_after_s:" in problems[0], problems
    assert "write a number" in problems[0], problems
    _, problems = sections(tmp_path, "slurm: {node: 'n 1'}\n")
    assert len(problems) == 1 and "slurm.node: String should match pattern" in problems[0], problems


def test_a_node_slurmctld_does_not_know() -> None:
    with pytest.raises(commands.SlurmError, match="does not know node 'n9'"):
        nodes.parse_node('{"nodes": []}', "n9")
