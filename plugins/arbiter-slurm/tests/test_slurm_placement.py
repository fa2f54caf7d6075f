"""How soon fleet work runs where it may, against a real slurmctld and two slurmd on loopback
(see :mod:`arbiter_testing.slurm`): a node's features follow what it admits as soon as the
daemon decides, not at its next tick, and a job Slurm gave up placing (it was requeued while
no node admitted GPU work) is placed as soon as a node admits again."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter_slurm import nodes
from arbiter_testing.reaction import write_phase
from arbiter_testing.rules import own_sleep, phase_rule
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(240)]

WAIT_S = 60.0
#: far longer than the waits below on the features: a tick does not tell them
TICK_S = 60.0
#: the first of the numbers that make the protected stand-in's command line its own
STAND_IN = 975000


def _job(slurm: SlurmCluster, job: int) -> dict[str, Any]:
    return slurm.jobs().get(job) or {}


def test_a_job_requeued_while_no_node_admits_is_placed_once_one_does(
    slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    nodes.sync("n1", {"gpu_jobs_admitted": True}, None)
    nodes.sync("n2", {"gpu_jobs_admitted": False}, None)
    job = slurm.sbatch("sleep 300\n", "--requeue", "--constraint=arbiter-admit")
    wait_until(lambda: _job(slurm, job).get("job_state") == "RUNNING", WAIT_S, "the job running", poll_s=0.1)
    nodes.sync("n1", {"gpu_jobs_admitted": False}, None)
    slurm.run("scontrol", "requeue", str(job))
    wait_until(lambda: _job(slurm, job).get("job_state") == "PENDING", WAIT_S, "the job requeued", poll_s=0.1)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    # Slurm has tried to place it while no node had arbiter-admit, and gives up until a
    # periodic pass (15 to 20 s on)
    wait_until(
        lambda: _job(slurm, job).get("state_reason") == nodes.BAD_CONSTRAINTS,
        WAIT_S,
        "Slurm giving up placing the job for now",
        poll_s=0.1,
    )
    try:
        nodes.sync("n2", {"gpu_jobs_admitted": True}, None)
        seen = _job(slurm, job)
        assert seen.get("job_state") == "RUNNING" or seen.get("state_reason") != nodes.BAD_CONSTRAINTS, seen
        wait_until(
            lambda: _job(slurm, job).get("job_state") == "RUNNING" and _job(slurm, job).get("nodes") == "n2",
            WAIT_S,
            "the job running on n2",
            poll_s=0.1,
        )
    finally:
        slurm.run("scancel", str(job), check=False)


def test_the_nodes_features_follow_a_phase_at_once_not_at_the_next_tick(slurm: SlurmCluster) -> None:
    events = slurm.root / "phase.jsonl"
    events.touch()
    marker = own_sleep(STAND_IN)
    n1 = slurm.start_arbiter("n1", tick_s=TICK_S)
    stand_in = n1.spawn(marker.split())
    n1.add_rule("stand-in", phase_rule("stand-in", marker, events, scope="all"))
    n1.call("reload")  # the rule and its program seen now, not a tick on

    def admits() -> bool:
        return "arbiter-admit" in slurm.features().get("n1", set())

    try:
        wait_until(admits, WAIT_S, "n1 admitting GPU work", poll_s=0.1)
        write_phase(events, "on")
        wait_until(lambda: not admits(), TICK_S / 4, "arbiter-admit gone from n1 with the phase on", poll_s=0.1)
        write_phase(events, "off")
        wait_until(admits, TICK_S / 4, "arbiter-admit back on n1 with the phase off", poll_s=0.1)
    finally:
        stand_in.terminate()
        stand_in.wait()
