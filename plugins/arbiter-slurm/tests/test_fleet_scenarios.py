"""A fleet of four nodes under a real Slurm, end to end through sbatch: a protected program on
one node holds that node's jobs there (stopped at once, ``S`` in squeue) and sends new work
elsewhere; held past the drain time the node is drained with arbiter's reason, and past the
eviction time its requeueable jobs run again on other nodes, carrying on from their
checkpoint, while a job that may not be requeued ends.  See conftest.py for the cluster."""

from __future__ import annotations

import re
from collections import Counter
from functools import partial
from typing import Any

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300)]

WAIT_S = 60.0
NODES = ("n1", "n2", "n3", "n4")
SLURM_TRANSLATOR = {"translators": {"pause": ["slurm"], "terminate": ["slurm"]}}
#: the jobs' processes are stopped here; slurmd's own stop (SIGSTOP ~2 s after SIGTSTP) too
STOPPED = ("T", "t")


def start_fleet(fleet: SlurmCluster, **config: Any) -> dict[str, HarnessNode]:
    """An arbiter daemon on every node, each protecting its own ``game`` (not started yet)."""
    nodes = {}
    for i, name in enumerate(NODES):
        node = fleet.start_arbiter(name, tick_s=1.0, **SLURM_TRANSLATOR, **config)
        node.add_rule("game", game_rule(game_marker(i)))
        nodes[name] = node
    wait_until(
        lambda: all("arbiter-admit" in fleet.features().get(n, set()) for n in NODES),
        WAIT_S,
        "arbiter-admit on every node",
        poll_s=0.2,
    )
    return nodes


def game_marker(index: int) -> str:
    return f"sleep {970000 + index}"


def game_rule(marker: str) -> dict[str, Any]:
    """A protected program that holds GPU fleet work back whenever it runs (what it does on
    the GPU is not read here: the stand-in GPU is a CPU core, which a busy machine shares)."""
    return {
        "id": "game",
        "match": {"cmdline": [marker]},
        "protect": {"metric": "gpu_share"},
        "pause_fleet": {"scope": "gpu"},
    }


def start_game(node: HarnessNode, name: str) -> Any:
    """The node's protected program."""
    return node.spawn(game_marker(NODES.index(name)).split())


def placed(fleet: SlurmCluster, jobs: list[int]) -> dict[int, str] | None:
    """Each job's node, once every one of them runs."""
    seen = fleet.jobs()
    if not all(seen.get(j, {}).get("job_state") == "RUNNING" for j in jobs):
        return None
    return {j: seen[j]["nodes"] for j in jobs}


def states(fleet: SlurmCluster, jobs: list[int]) -> set[str]:
    seen = fleet.jobs()
    return {seen[j]["job_state"] for j in jobs}


def job_pids(fleet: SlurmCluster, jobs: list[int], node: str) -> list[int] | None:
    pids = []
    for job in jobs:
        out = fleet.run("scontrol", "listpids", str(job), node, check=False)
        pids += [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]
    return pids or None


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def all_stopped(fleet: SlurmCluster, jobs: list[int], node: str) -> bool:
    """Every process the jobs have now is stopped (a process that has just ended is not there)."""
    seen = [proc_state(p) for p in job_pids(fleet, jobs, node) or []]
    return bool(seen) and all(s in STOPPED for s in seen if s not in ("gone", "Z"))


def restarted_output(fleet: SlurmCluster, job: int) -> str | None:
    """The job's output once its second run has written its first line."""
    out = fleet.output(job)
    return out if "restart=1" in out else None


def running_again(fleet: SlurmCluster, job: int) -> str | None:
    """The node the job runs on again after one requeue (else None); what went wrong if it ended."""
    j = fleet.jobs()[job]
    if j["job_state"] == "RUNNING" and j["restart_cnt"] == 1:
        return str(j["nodes"])
    if j["job_state"] in ("FAILED", "CANCELLED", "COMPLETED"):
        raise AssertionError(f"job {job} ended {j['job_state']} ({j.get('state_reason')}):\n{fleet.logs()}")
    return None


def adopted(node: HarnessNode, job: int) -> dict[str, Any] | None:
    return next((j for j in node.status()["jobs"] if j["id"] == f"slurm-{job}"), None)


def explained(node: HarnessNode, job: int) -> dict[str, Any]:
    (item,) = node.call("explain", subject=f"slurm-{job}")["explain"]["items"]
    return item  # type: ignore[no-any-return]


def test_a_protected_program_holds_its_nodes_jobs_there_and_new_work_goes_elsewhere(fleet: SlurmCluster) -> None:
    nodes = start_fleet(fleet)
    jobs = [fleet.sbatch("sleep 3000\n", "--requeue", "--constraint=arbiter-admit") for _ in range(8)]
    where = wait_until(partial(placed, fleet, jobs), WAIT_S, "the 8 jobs running", poll_s=0.2)
    assert Counter(where.values()) == dict.fromkeys(NODES, 2), where  # spread: two a node
    for job, name in where.items():
        wait_until(partial(adopted, nodes[name], job), WAIT_S, f"slurm-{job} adopted on {name}", poll_s=0.2)
    on_n2 = [j for j, n in where.items() if n == "n2"]
    elsewhere = [j for j in jobs if j not in on_n2]

    game = start_game(nodes["n2"], "n2")
    try:
        wait_until(partial(all_stopped, fleet, on_n2, "n2"), WAIT_S, "n2's job processes stopped")
        wait_until(lambda: states(fleet, on_n2) == {"SUSPENDED"}, WAIT_S, "n2's jobs S in squeue", poll_s=0.2)
        assert states(fleet, elsewhere) == {"RUNNING"}  # the other nodes' work goes on
        wait_until(lambda: "arbiter-admit" not in fleet.features()["n2"], WAIT_S, "n2 without arbiter-admit")
        assert all("arbiter-admit" in fleet.features()[n] for n in NODES if n != "n2")
        item = explained(nodes["n2"], on_n2[0])
        assert item["state"] == "paused" and item["reasons"][0]["code"] == "RULE_PAUSE_FLEET", item
        assert item["protection_pause"]["evict_after_s"] is None, item  # eviction is off by default

        new = [fleet.sbatch("sleep 3000\n", "--requeue", "--constraint=arbiter-admit") for _ in range(2)]
        landed = wait_until(partial(placed, fleet, new), WAIT_S, "the new jobs running", poll_s=0.2)
        assert "n2" not in landed.values(), landed
    finally:
        game.terminate()
        game.wait()
    wait_until(lambda: states(fleet, on_n2) == {"RUNNING"}, WAIT_S, "n2's jobs R in squeue again", poll_s=0.2)
    wait_until(
        lambda: not any(proc_state(p) in STOPPED for p in job_pids(fleet, on_n2, "n2") or []),
        WAIT_S,
        "n2's job processes running again",
    )
    wait_until(lambda: "arbiter-admit" in fleet.features()["n2"], WAIT_S, "arbiter-admit back on n2", poll_s=0.2)
    assert fleet.jobs()[on_n2[0]]["restart_cnt"] == 0  # held, never moved


#: a job that counts its work in a file beside it and, run again, carries on from there
CHECKPOINTED = """\
f={root}/work-$SLURM_JOB_ID
n=$(cat "$f" 2>/dev/null || echo 0)
echo "restart=${{SLURM_RESTART_COUNT:-0}} from=$n"
while :; do n=$((n + 1)); echo $n > "$f.tmp" && mv "$f.tmp" "$f"; sleep 0.2; done
"""
DRAIN_S = 1.0
EVICT_S = 8.0


def test_held_past_the_drain_and_eviction_times_requeueable_work_runs_elsewhere(fleet: SlurmCluster) -> None:
    nodes = start_fleet(fleet, slurm={"drain_after_s": DRAIN_S}, evict_after_s=EVICT_S)
    script = CHECKPOINTED.format(root=fleet.root)
    jobs = [fleet.sbatch(script, "--requeue", "--constraint=arbiter-admit") for _ in range(8)]
    where = wait_until(partial(placed, fleet, jobs), WAIT_S, "the 8 jobs running", poll_s=0.2)
    once = fleet.sbatch("sleep 3000\n", "--nodelist=n2", "--no-requeue")
    wait_until(partial(placed, fleet, [once]), WAIT_S, "the job that may not be requeued running on n2")
    movable = [j for j, n in where.items() if n == "n2"]
    assert movable, where
    for job in [*movable, once]:
        wait_until(partial(adopted, nodes["n2"], job), WAIT_S, f"slurm-{job} adopted on n2", poll_s=0.2)
    for job in movable:  # each has done some work to carry on from
        wait_until((fleet.root / f"work-{job}").exists, WAIT_S, f"job {job}'s checkpoint")

    game = start_game(nodes["n2"], "n2")
    try:
        wait_until(partial(all_stopped, fleet, [*movable, once], "n2"), WAIT_S, "n2's job processes stopped")
        item = explained(nodes["n2"], movable[0])
        assert item["state"] == "paused" and item["protection_pause"]["evict_after_s"] == EVICT_S, item
        stopped_at = {j: int((fleet.root / f"work-{j}").read_text()) for j in movable}

        reason = wait_until(lambda: fleet.reasons().get("n2"), WAIT_S, "n2 drained", poll_s=0.2)
        assert reason == "arbiter: game RULE_PAUSE_FLEET", reason
        for job in movable:
            try:
                moved = wait_until(partial(running_again, fleet, job), WAIT_S, f"job {job} running again", poll_s=0.2)
            except AssertionError as exc:
                seen = {k: v for k, v in fleet.jobs()[job].items() if "state" in k or k in ("nodes", "restart_cnt")}
                raise AssertionError(f"{exc}\nsqueue: {seen}\nn2's daemon:\n{nodes['n2'].log()}") from None
            assert moved != "n2", moved
            wait_until(partial(adopted, nodes[moved], job), WAIT_S, f"slurm-{job} adopted on {moved}", poll_s=0.2)
            out = wait_until(partial(restarted_output, fleet, job), WAIT_S, f"job {job}'s output after its restart")
            found = re.search(r"restart=1 from=(\d+)", out)
            assert found is not None, out
            carried = int(found[1])
            assert carried >= stopped_at[job] > 0, (out, stopped_at)  # its work goes on from its checkpoint
            (evicted,) = [
                e for e in nodes["n2"].events("JOB_STOPPED", f"slurm-{job}") if e["data"]["reasons"] == ["JOB_EVICTED"]
            ]
            assert "past evict_after_s (8s)" in evicted["message"], evicted
        ended = wait_until(
            lambda: (
                (s := fleet.jobs()[once]["job_state"]) not in ("RUNNING", "SUSPENDED", "PENDING", "COMPLETING") and s
            ),
            WAIT_S,
            "the job that may not be requeued ended",
            poll_s=0.2,
        )
        assert ended in ("CANCELLED", "FAILED", "COMPLETED") and fleet.jobs()[once]["restart_cnt"] == 0, ended
        assert all(fleet.jobs()[j]["restart_cnt"] == 0 for j in jobs if j not in movable)  # held nowhere else
    finally:
        game.terminate()
        game.wait()
    wait_until(lambda: "n2" not in fleet.reasons(), WAIT_S, "n2's arbiter drain lifted", poll_s=0.2)
    wait_until(lambda: "arbiter-admit" in fleet.features()["n2"], WAIT_S, "arbiter-admit back on n2", poll_s=0.2)
