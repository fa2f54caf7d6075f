"""A fleet of four nodes under a real Slurm, end to end through sbatch, one fleet for every
test here (each leaves it idle, as it found it):

1. a protected program on n2 holds n2's jobs there (stopped at once, ``S`` in squeue) and
   sends new work elsewhere;
2. held past the drain time n4 is drained with arbiter's reason, and past the eviction time its
   requeueable jobs run again on other nodes, carrying on from their checkpoint, while a job
   that may not be requeued ends (n4 alone is set to drain after 1 s and evict after 8 s);
3. slurmctld restarted: arbiter's features are set again, and an operator's drain on n3 stays;
4. n1's daemon killed with -9 while it held its jobs, then started again: it adopts them from
   squeue and scontrol listpids, and leaves none suspended.

See conftest.py for the cluster."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.rules import game_rule, own_sleep
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("slurm-fleet")]

WAIT_S = 60.0
NODES = ("n1", "n2", "n3", "n4")
SLURM_TRANSLATOR = {"translators": {"pause": ["slurm"], "terminate": ["slurm"]}}
#: the jobs' processes are stopped here; slurmd's own stop (SIGSTOP ~2 s after SIGTSTP) too
STOPPED = ("T", "t")


#: n4 moves its work off quickly when held (scenario 2); the others keep the defaults
HASTY = "n4"
DRAIN_S = 1.0
EVICT_S = 8.0


@pytest.fixture(scope="module")
def nodes(fleet: SlurmCluster) -> dict[str, HarnessNode]:
    """An arbiter daemon on every node of the fleet, each protecting its own ``game`` (not
    started yet)."""
    out = {}
    for i, name in enumerate(NODES):
        hasty: dict[str, Any] = {"slurm": {"drain_after_s": DRAIN_S}, "evict_after_s": EVICT_S}
        node = fleet.start_arbiter(name, tick_s=1.0, **SLURM_TRANSLATOR, **(hasty if name == HASTY else {}))
        node.add_rule("game", game_rule("game", own_sleep(GAME + i)))
        out[name] = node
    return out


@pytest.fixture(autouse=True)
def idle(fleet: SlurmCluster, nodes: dict[str, HarnessNode]) -> Iterator[None]:
    """The fleet idle before and after each test: no job, every node admitting GPU work and
    drained by no one."""
    settled(fleet, nodes)
    yield
    fleet.run("scancel", "--full", "--user", "root", check=False)
    settled(fleet, nodes)


#: the states of a job that has not ended (squeue --json shows ended jobs for a while too)
LIVE = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED")


def settled(fleet: SlurmCluster, nodes: dict[str, HarnessNode]) -> None:
    wait_until(
        lambda: not [j for j in fleet.jobs().values() if j["job_state"] in LIVE],
        WAIT_S,
        "no job left in squeue",
        poll_s=0.2,
    )
    for name, node in nodes.items():
        wait_until(partial(no_jobs, node), WAIT_S, f"no job left on {name}'s daemon", poll_s=0.2)
    wait_until(
        lambda: all("arbiter-admit" in fleet.features().get(n, set()) for n in NODES) and not fleet.reasons(),
        WAIT_S,
        "arbiter-admit on every node, none drained",
        poll_s=0.2,
    )


def no_jobs(node: HarnessNode) -> bool:
    return not node.status()["jobs"]


#: the first of the numbers that make each node's game its own command line
GAME = 975000


def start_game(node: HarnessNode, name: str) -> Any:
    """The node's protected program."""
    return node.spawn(own_sleep(GAME + NODES.index(name)).split())


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


def test_a_protected_program_holds_its_nodes_jobs_there_and_new_work_goes_elsewhere(
    fleet: SlurmCluster, nodes: dict[str, HarnessNode]
) -> None:
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
        # the daemon's status (and so its page and metrics) says what Slurm is told
        (told,) = wait_until(
            lambda: [t for t in nodes["n2"].status()["scheduler_labels"] if "arbiter-admit" not in t["labels"]],
            WAIT_S,
            "n2's status without arbiter-admit",
        )
        assert told["scheduler"] == "slurm" and told["node"] == "n2" and "arbiter" not in told["labels"], told
        assert told["error"] == "", told
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


def test_held_past_the_drain_and_eviction_times_requeueable_work_runs_elsewhere(
    fleet: SlurmCluster, nodes: dict[str, HarnessNode]
) -> None:
    script = CHECKPOINTED.format(root=fleet.root)
    jobs = [fleet.sbatch(script, "--requeue", "--constraint=arbiter-admit") for _ in range(8)]
    where = wait_until(partial(placed, fleet, jobs), WAIT_S, "the 8 jobs running", poll_s=0.2)
    once = fleet.sbatch("sleep 3000\n", f"--nodelist={HASTY}", "--no-requeue")
    wait_until(partial(placed, fleet, [once]), WAIT_S, f"the job that may not be requeued running on {HASTY}")
    movable = [j for j, n in where.items() if n == HASTY]
    assert movable, where
    held = nodes[HASTY]
    for job in [*movable, once]:
        wait_until(partial(adopted, held, job), WAIT_S, f"slurm-{job} adopted on {HASTY}", poll_s=0.2)
    for job in movable:  # each has done some work to carry on from
        wait_until((fleet.root / f"work-{job}").exists, WAIT_S, f"job {job}'s checkpoint")

    game = start_game(held, HASTY)
    try:
        wait_until(partial(all_stopped, fleet, [*movable, once], HASTY), WAIT_S, f"{HASTY}'s job processes stopped")
        item = explained(held, movable[0])
        assert item["state"] == "paused" and item["protection_pause"]["evict_after_s"] == EVICT_S, item
        stopped_at = {j: int((fleet.root / f"work-{j}").read_text()) for j in movable}

        reason = wait_until(lambda: fleet.reasons().get(HASTY), WAIT_S, f"{HASTY} drained", poll_s=0.2)
        assert reason == "arbiter: game RULE_PAUSE_FLEET", reason
        for job in movable:
            try:
                moved = wait_until(partial(running_again, fleet, job), WAIT_S, f"job {job} running again", poll_s=0.2)
            except AssertionError as exc:
                seen = {k: v for k, v in fleet.jobs()[job].items() if "state" in k or k in ("nodes", "restart_cnt")}
                raise AssertionError(f"{exc}\nsqueue: {seen}\n{HASTY}'s daemon:\n{held.log()}") from None
            assert moved != HASTY, moved
            wait_until(partial(adopted, nodes[moved], job), WAIT_S, f"slurm-{job} adopted on {moved}", poll_s=0.2)
            out = wait_until(partial(restarted_output, fleet, job), WAIT_S, f"job {job}'s output after its restart")
            found = re.search(r"restart=1 from=(\d+)", out)
            assert found is not None, out
            carried = int(found[1])
            assert carried >= stopped_at[job] > 0, (out, stopped_at)  # its work goes on from its checkpoint
            (evicted,) = [
                e for e in held.events("JOB_STOPPED", f"slurm-{job}") if e["data"]["reasons"] == ["JOB_EVICTED"]
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
    wait_until(lambda: HASTY not in fleet.reasons(), WAIT_S, f"{HASTY}'s arbiter drain lifted", poll_s=0.2)
    wait_until(lambda: "arbiter-admit" in fleet.features()[HASTY], WAIT_S, f"arbiter-admit back on {HASTY}", poll_s=0.2)


#: how often each daemon sets its node's features in Slurm again (the scheduler-jobs period)
PUBLISH_S = 5.0


def test_after_slurmctld_restarts_the_features_are_set_again_and_an_operators_drain_stays(
    fleet: SlurmCluster, nodes: dict[str, HarnessNode]
) -> None:
    jobs = [fleet.sbatch("sleep 3000\n", "--requeue", "--constraint=arbiter-admit") for _ in range(4)]
    wait_until(partial(placed, fleet, jobs), WAIT_S, "the 4 jobs running", poll_s=0.2)
    fleet.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=disk replacement")
    try:
        fleet.restart_controller()
        restarted = time.monotonic()
        # slurm.conf's static feature comes back with slurmctld; arbiter's own only when each
        # daemon sets them again
        wait_until(
            lambda: all("arbiter" in fleet.features().get(n, set()) for n in NODES),
            WAIT_S,
            "slurmctld answering",
            poll_s=0.1,
            ignore=(AssertionError, ValueError),
        )
        wait_until(
            lambda: all("arbiter-admit" in fleet.features()[n] for n in NODES),
            WAIT_S,
            "arbiter-admit on every node again",
            poll_s=0.1,
            ignore=(AssertionError, ValueError),
        )
        took = time.monotonic() - restarted
        print(f"features set again {took:.1f}s after slurmctld restarted (publish period {PUBLISH_S:g}s)")
        # n3's daemon has set its features on the drained node: it saw the drain, and an
        # operator's drain is not arbiter's to lift
        assert fleet.reasons().get("n3") == "disk replacement", fleet.reasons()
        assert states(fleet, jobs) == {"RUNNING"}  # a drain keeps new work away, not the jobs there
        seen = {n: nodes[n].status()["scheduler_labels"][0]["labels"] for n in NODES}
        assert all("arbiter-admit" in labels for labels in seen.values()), seen
    finally:
        fleet.run("scontrol", "update", "NodeName=n3", "State=RESUME", check=False)


def test_a_daemon_killed_and_restarted_adopts_its_jobs_again_and_leaves_none_suspended(
    fleet: SlurmCluster, nodes: dict[str, HarnessNode]
) -> None:
    jobs = [fleet.sbatch("sleep 3000\n", "--requeue", "--constraint=arbiter-admit") for _ in range(8)]
    where = wait_until(partial(placed, fleet, jobs), WAIT_S, "the 8 jobs running", poll_s=0.2)
    on_n1 = [j for j, n in where.items() if n == "n1"]
    assert on_n1, where
    n1 = nodes["n1"]
    for job in on_n1:
        wait_until(partial(adopted, n1, job), WAIT_S, f"slurm-{job} adopted on n1", poll_s=0.2)

    game = start_game(n1, "n1")
    try:
        wait_until(partial(all_stopped, fleet, on_n1, "n1"), WAIT_S, "n1's job processes stopped")
        wait_until(lambda: states(fleet, on_n1) == {"SUSPENDED"}, WAIT_S, "n1's jobs S in squeue", poll_s=0.2)
        n1.kill_daemon()
    finally:
        game.terminate()
        game.wait()
    # the protected program is gone, and no daemon is there to say so: its jobs wait
    assert states(fleet, on_n1) == {"SUSPENDED"}
    # what the daemon knew of its jobs goes with its database: the scheduler's word is what
    # brings them back (its journal of what it paused stays, as a crash leaves it)
    for path in n1.state_dir.glob("state.db*"):
        path.unlink()
    fleet.restart_arbiter("n1")
    for job in on_n1:
        seen = wait_until(partial(adopted, n1, job), WAIT_S, f"slurm-{job} adopted again", poll_s=0.2)
        assert seen["state"] == "run", seen
    wait_until(lambda: states(fleet, on_n1) == {"RUNNING"}, WAIT_S, "n1's jobs R in squeue again", poll_s=0.2)
    wait_until(
        lambda: not any(proc_state(p) in STOPPED for p in job_pids(fleet, on_n1, "n1") or []),
        WAIT_S,
        "n1's job processes running again",
    )
    resumed = n1.events("JOB_RESUMED", "node")
    assert any("left by a previous daemon" in e["message"] for e in resumed), resumed
    for job in on_n1:  # known again from the scheduler: no hook runs for a job already started
        adoptions = n1.events("JOB_ADOPTED", f"slurm-{job}")
        assert any("reconciling" in e["message"] for e in adoptions), adoptions
    # every job runs, none moved (a node whose daemon failed safe for a moment on a loaded
    # machine resumes its jobs once it reads again: wait for it, and say why when it does not)
    try:
        wait_until(lambda: states(fleet, jobs) == {"RUNNING"}, WAIT_S, "every job R in squeue", poll_s=0.2)
        assert all(fleet.jobs()[j]["restart_cnt"] == 0 for j in jobs), "a job was requeued"
    except AssertionError as exc:
        squeue = {j: (v["job_state"], v["nodes"], v["restart_cnt"]) for j, v in fleet.jobs().items() if j in jobs}
        said = {n: [f"{e['code']} {e['subject']}: {e['message']}" for e in nodes[n].events(limit=30)] for n in NODES}
        raise AssertionError(f"{exc}\nsqueue: {squeue}\ntimelines: {said}") from None
    wait_until(lambda: "arbiter-admit" in fleet.features()["n1"], WAIT_S, "arbiter-admit on n1 again", poll_s=0.2)
