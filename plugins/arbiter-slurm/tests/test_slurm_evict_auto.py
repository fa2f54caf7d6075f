"""``evict_after_s: auto`` against a real slurmctld and slurmd (see :mod:`arbiter_testing.slurm`):
a node that has not yet seen its protected program end waits as long as an eviction costs,
and once it has seen protection outlast that, it requeues a job the moment protection
pauses it, saying why in ``explain`` and on the timeline."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter_testing.rules import game_rule, own_sleep
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300)]

WAIT_S = 60.0
COST_S = 1.0
#: the protected program's command line: a sleep of its own
GAME = own_sleep(975000)


def stopped(slurm: SlurmCluster, job: int, node: str) -> bool:
    out = slurm.run("scontrol", "listpids", str(job), node, check=False)
    pids = [line.split()[0] for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]
    states = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                states.append(fh.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return bool(states) and all(s in ("T", "t", "Z") for s in states)


def adopted(node: Any, key: str) -> bool:
    return any(j["id"] == key for j in node.status()["jobs"])


def evictions(node: Any, job: int) -> list[dict[str, Any]]:
    """The job's evictions: each stop begun, not the kill that ends one whose processes
    outlived its grace (on a busy node, Slurm's requeue can take that long)."""
    return [
        e
        for e in node.events("JOB_STOPPED", f"slurm-{job}")
        if e["data"]["reasons"] == ["JOB_EVICTED"] and e["data"].get("step") != "killed"
    ]


def restarts(slurm: SlurmCluster, job: int) -> int:
    return int(slurm.jobs()[job]["restart_cnt"])


def test_auto_evicts_at_once_once_protection_here_has_outlasted_an_evictions_cost(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter(
        "n1",
        translators={"pause": ["slurm"], "terminate": ["slurm"]},
        tick_s=1.0,
        evict_after_s="auto",
        evict_cost_s=COST_S,
    )
    n1.add_rule("game", game_rule("game", GAME))
    slurm.start_arbiter("n2", translators={"pause": ["slurm"], "terminate": ["slurm"]}, tick_s=1.0)
    both = ("n1", "n2")  # n2 admits: there is somewhere else to go
    wait_until(lambda: all("arbiter-admit" in slurm.features()[n] for n in both), WAIT_S, "both admitting", poll_s=0.1)
    # placed again only where GPU work is admitted: back on n1 once its protection ends
    job = slurm.sbatch("sleep 3000\n", "--nodelist=n1", "--requeue", "--constraint=arbiter-admit")
    wait_until(lambda: adopted(n1, f"slurm-{job}"), WAIT_S, "the job adopted", poll_s=0.1)

    g1 = n1.spawn(GAME.split())
    try:  # nothing seen yet: it waits as long as an eviction costs, and explain says so
        wait_until(lambda: stopped(slurm, job, "n1"), WAIT_S, "the job stopped on n1", poll_s=0.05)
        (item,) = n1.call("explain", subject=f"slurm-{job}")["explain"]["items"]
        held = item.get("protection_pause")
        if held is not None:  # not yet evicted
            assert held["evict_after_s"] == COST_S, held
            assert "no protection by 'game' has ended here yet" in held["evict_basis"], held
        wait_until(lambda: restarts(slurm, job) >= 1, WAIT_S, "the job requeued", poll_s=0.1)
        (first,) = evictions(n1, job)
        assert f"past evict_after_s (auto: {COST_S:g}s, because no protection" in first["message"], first
    finally:
        g1.terminate()
        g1.wait()  # this protection lasted past the eviction's cost
    wait_until(
        lambda: slurm.jobs()[job]["job_state"] == "RUNNING" and adopted(n1, f"slurm-{job}"),
        WAIT_S,
        "the job running on n1 again",
        poll_s=0.1,
    )

    g1 = n1.spawn(GAME.split())
    try:  # the rule's protection outlasts an eviction here: requeued at once, not suspended first
        wait_until(lambda: restarts(slurm, job) >= 2, WAIT_S, "the job requeued again", poll_s=0.1)
    finally:
        g1.terminate()
        g1.wait()
    second = wait_until(lambda: evictions(n1, job)[1:] or None, WAIT_S, "the second eviction")[0]
    # paused a moment (the fast path's stop), requeued at the first decision (the timeline cuts the why short)
    assert "past evict_after_s (auto: 0s, because the last 1 protec" in second["message"], second
    slurm.run("scancel", str(job), check=False)
