"""Every shape of Slurm job under the ``slurm`` translator, against a real slurmctld and two
slurmd on loopback (see :mod:`arbiter_testing.slurm`): a job on two nodes with protection
moving between them, an array's tasks paused and evicted by task with one of them pending,
three jobs evicted at once, and a job that saves its work on its checkpoint signal before it
is requeued (the job's own, or the evicting rule's)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import pytest

from arbiter_testing.rules import game_rule, own_sleep
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(300)]

WAIT_S = 60.0
T = TypeVar("T")
SLURM_TRANSLATOR = {"pause": ["slurm"], "terminate": ["slurm"]}
#: the first of the numbers that make each node's protected program its own command line
GAME = 965000
STOPPED = ("T", "t")
GONE = ("gone", "Z")


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def pids_of(slurm: SlurmCluster, job: int, node: str) -> list[int]:
    out = slurm.run("scontrol", "listpids", str(job), node, check=False)
    return [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]


def live(pids: list[int]) -> list[str]:
    return [s for s in map(proc_state, pids) if s not in GONE]


def stopped(slurm: SlurmCluster, job: int, node: str) -> bool:
    seen = live(pids_of(slurm, job, node))
    return bool(seen) and all(s in STOPPED for s in seen)


def running(slurm: SlurmCluster, job: int, node: str) -> bool:
    seen = live(pids_of(slurm, job, node))
    return bool(seen) and all(s not in STOPPED for s in seen)


def protecting(cluster: SlurmCluster, name: str, index: int, **config: Any) -> Any:
    node = cluster.start_arbiter(name, translators=SLURM_TRANSLATOR, tick_s=1.0, **config)
    node.add_rule("game", game_rule("game", own_sleep(GAME + index)))
    return node


def game(node: Any, index: int) -> Any:
    return node.spawn(own_sleep(GAME + index).split())


def end(proc: Any) -> None:
    proc.terminate()
    proc.wait()


def seen_if(value: T, test: Callable[[T], bool]) -> T | None:
    """``value`` when it passes ``test``, else None (what a wait goes on waiting on)."""
    return value if test(value) else None


def adopted(node: Any, key: str) -> bool:
    return any(j["id"] == key for j in node.status()["jobs"])


def test_a_two_node_job_runs_only_once_both_nodes_let_it_go(slurm: SlurmCluster) -> None:
    n1, n2 = protecting(slurm, "n1", 0), protecting(slurm, "n2", 1)
    job = slurm.sbatch("srun sleep 300\n", "-N2", "--nodelist=n1,n2", "--requeue")
    for name in ("n1", "n2"):
        wait_until(partial(running, slurm, job, name), WAIT_S, f"the job's task on {name}", poll_s=0.1)
    wait_until(lambda: adopted(n2, f"slurm-{job}.0.0"), WAIT_S, "n2's task adopted", poll_s=0.1)
    g1 = game(n1, 0)
    wait_until(lambda: stopped(slurm, job, "n1"), WAIT_S, "the job stopped on n1", poll_s=0.05)
    wait_until(lambda: slurm.jobs()[job]["job_state"] == "SUSPENDED", WAIT_S, "S in squeue", poll_s=0.1)
    g2 = game(n2, 1)
    try:
        wait_until(lambda: stopped(slurm, job, "n2"), WAIT_S, "the job stopped on n2", poll_s=0.05)
        wait_until(lambda: "arbiter-admit" not in slurm.features()["n2"], WAIT_S, "n2 holding GPU work", poll_s=0.1)
        end(g1)  # n1 lets the job go; n2 still protects
        wait_until(lambda: "arbiter-admit" in slurm.features()["n1"], WAIT_S, "n1 admitting again", poll_s=0.1)
        # n1 runs its own task again, and leaves the job suspended in Slurm for n2
        n1.events("SLURM_RESUME_DEFERRED", contains="n2")
        wait_until(lambda: running(slurm, job, "n1"), WAIT_S, "the task on n1 running again", poll_s=0.05)
        assert stopped(slurm, job, "n2"), live(pids_of(slurm, job, "n2"))
        assert slurm.jobs()[job]["job_state"] == "SUSPENDED"
        assert not [e for e in n2.call("timeline", code="SLURM_JOB_RESTOPPED")["events"]]
        # explain says how long an evicted job would still run here
        (item,) = n2.call("explain", subject=f"slurm-{job}.0.0")["explain"]["items"]
        assert "at most 10s to save its work" in item["pause_effect"], item
        assert "killed 5s after Slurm's SIGTERM" in item["pause_effect"], item

        # whoever continues the job in Slurm, n2 stops its task again at once and says so
        slurm.run("scontrol", "resume", str(job))
        n2.events("SLURM_JOB_RESTOPPED", contains="ran again")
        wait_until(lambda: stopped(slurm, job, "n2"), WAIT_S, "n2's task stopped again", poll_s=0.05)
        wait_until(lambda: slurm.jobs()[job]["job_state"] == "SUSPENDED", WAIT_S, "S in squeue again", poll_s=0.1)
    finally:
        end(g2)
    wait_until(lambda: slurm.jobs()[job]["job_state"] == "RUNNING", WAIT_S, "R in squeue", poll_s=0.1)
    for name in ("n1", "n2"):
        wait_until(partial(running, slurm, job, name), WAIT_S, f"the job running on {name}", poll_s=0.1)


def test_a_two_node_job_held_long_on_one_node_is_requeued_whole(slurm: SlurmCluster) -> None:
    protecting(slurm, "n1", 0)
    n2 = protecting(slurm, "n2", 1, evict_after_s=2.0)
    # a job asking for arbiter-admit on named nodes is refused at submission until both carry it
    both = {"n1", "n2"}
    wait_until(
        lambda: all("arbiter-admit" in slurm.features()[n] for n in both), WAIT_S, "n1 and n2 admitting", poll_s=0.1
    )
    job = slurm.sbatch("srun sleep 300\n", "-N2", "--nodelist=n1,n2", "--requeue", "--constraint=arbiter-admit")
    wait_until(lambda: adopted(n2, f"slurm-{job}.0.0"), WAIT_S, "n2's task adopted", poll_s=0.1)
    first = pids_of(slurm, job, "n1")
    g2 = game(n2, 1)
    try:
        stops = n2.events("JOB_STOPPED", f"slurm-{job}.0.0")
        assert [e["data"]["reasons"] for e in stops] == [["JOB_EVICTED"]], stops
        # the whole job leaves, its processes on n1 too, and waits for nodes that all admit it
        wait_until(lambda: slurm.jobs()[job]["restart_cnt"] == 1, WAIT_S, "the job requeued", poll_s=0.1)
        wait_until(lambda: not live(first), WAIT_S, "the job's processes on n1 ended", poll_s=0.1)
        assert slurm.jobs()[job]["job_state"] in ("PENDING", "REQUEUED", "COMPLETING"), slurm.jobs()[job]
    finally:
        end(g2)
    wait_until(lambda: slurm.jobs()[job]["job_state"] == "RUNNING", WAIT_S, "the job running again", poll_s=0.1)


def tasks(slurm: SlurmCluster, array: int) -> dict[int, dict[str, Any]]:
    """The array's tasks in squeue, by task id (pending ones squeue shows together are left out)."""
    return {
        j["array_task_id"]: j
        for j in slurm.jobs().values()
        if j.get("array_job_id") == array and isinstance(j.get("array_task_id"), int)
    }


def test_an_array_is_paused_and_evicted_by_task_and_its_pending_task_ends_well(slurm: SlurmCluster) -> None:
    n1 = protecting(slurm, "n1", 0, evict_after_s=3.0)
    protecting(slurm, "n2", 1, evict_after_s=3.0)
    # four CPUs a node, two a task: four tasks run, two wait
    array = int(slurm.sbatch("sleep 8\n", "--array=0-5", "--cpus-per-task=2", "--requeue"))
    seen = wait_until(
        lambda: seen_if(tasks(slurm, array), lambda t: sum(j["job_state"] == "RUNNING" for j in t.values()) == 4),
        WAIT_S,
        "four tasks running",
        poll_s=0.1,
    )
    on_n1 = [i for i, j in seen.items() if j["job_state"] == "RUNNING" and j["nodes"] == "n1"]
    on_n2 = [i for i, j in seen.items() if j["job_state"] == "RUNNING" and j["nodes"] == "n2"]
    assert on_n1 and on_n2, seen
    for i in on_n1:
        wait_until(partial(adopted, n1, f"slurm-{array}_{i}"), WAIT_S, f"task {i} adopted on n1", poll_s=0.1)
    g1 = game(n1, 0)
    try:
        wait_until(
            lambda: all(tasks(slurm, array)[i]["job_state"] == "SUSPENDED" for i in on_n1),
            WAIT_S,
            "n1's tasks S in squeue",
            poll_s=0.1,
        )
        # by task: n2's tasks, and the waiting ones, are left alone
        now = tasks(slurm, array)
        assert all(now[i]["job_state"] in ("RUNNING", "COMPLETING", "COMPLETED") for i in on_n2), now
        # evicted, n1's tasks are requeued (one of them a pending task by then or not), none fails
        for i in on_n1:
            assert any(e["data"]["reasons"] == ["JOB_EVICTED"] for e in n1.events("JOB_STOPPED", f"slurm-{array}_{i}"))
        wait_until(
            lambda: all(tasks(slurm, array).get(i, {}).get("restart_cnt", 0) >= 1 for i in on_n1),
            WAIT_S,
            "n1's tasks requeued",
            poll_s=0.1,
        )
    finally:
        end(g1)
    done = wait_until(
        lambda: seen_if(
            tasks(slurm, array), lambda t: len(t) == 6 and all(j["job_state"] not in LIVE for j in t.values())
        ),
        WAIT_S * 2,
        "every task ended",
        poll_s=0.2,
    )
    assert {i: j["job_state"] for i, j in done.items()} == dict.fromkeys(range(6), "COMPLETED"), done


LIVE = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED")


def test_three_jobs_evicted_at_once_are_requeued_together(slurm: SlurmCluster) -> None:
    # the jobs take no notice of Slurm's SIGTERM: requeued one after the other, the second
    # would wait for the first to end here (Slurm's KillWait, 30 s) before it is requeued
    n1 = protecting(slurm, "n1", 0, evict_after_s=2.0, slurm={"requeue_grace_s": 600.0})
    jobs = [slurm.sbatch("trap '' TERM\nsleep 300\n", "--nodelist=n1", "--requeue") for _ in range(3)]
    for job in jobs:
        wait_until(partial(adopted, n1, f"slurm-{job}"), WAIT_S, f"slurm-{job} adopted", poll_s=0.1)
    first = pids_of(slurm, jobs[0], "n1")
    g1 = game(n1, 0)
    try:
        wait_until(
            lambda: (
                all(slurm.jobs()[j]["restart_cnt"] >= 1 or slurm.jobs()[j]["job_state"] != "RUNNING" for j in jobs)
                and all(slurm.jobs()[j]["job_state"] != "SUSPENDED" for j in jobs)
            ),
            WAIT_S,
            "all three requeued",
            poll_s=0.1,
        )
        assert live(first), "the first job's processes ended before the others were requeued"
    finally:
        end(g1)
        slurm.run("scancel", *map(str, jobs), check=False)


#: the checkpointing job's work: this many steps of 50 ms
STEPS = 200
WORKER = """\
#!{python}
#SBATCH --signal=B:USR1@30
import os, signal, sys, time
path = sys.argv[1]
try:
    done = int(open(path).read())
except (OSError, ValueError):
    done = 0
print(f"restart={{os.environ.get('SLURM_RESTART_COUNT', '0')}} from={{done}}", flush=True)
def save(signum, frame):
    with open(path + ".tmp", "w") as fh:
        fh.write(str(done))
    os.replace(path + ".tmp", path)
    print(f"saved={{done}}", flush=True)
signal.signal(signal.SIGUSR1, save)
while done < {steps}:
    time.sleep(0.05)
    done += 1
    if done % 20 == 0:
        print(f"at={{done}}", flush=True)
print(f"result={{done}}", flush=True)
"""


def test_a_job_saves_its_work_on_its_checkpoint_signal_before_it_is_requeued(slurm: SlurmCluster) -> None:
    n1 = protecting(slurm, "n1", 0, slurm={"checkpoint_s": 5.0})
    path = slurm.root / "job.py"
    path.write_text(WORKER.format(python=sys.executable, steps=STEPS))
    path.chmod(0o755)
    options = (f"--output={slurm.root}/out-%j.txt", "--open-mode=append", "--nodelist=n1", "--requeue")
    out = slurm.run("sbatch", "--parsable", *options, str(path), str(slurm.root / "saved"))
    job = int(out.strip().split(";")[0])
    wait_until(lambda: adopted(n1, f"slurm-{job}"), WAIT_S, "the job adopted", poll_s=0.1)
    wait_until(lambda: "at=40" in slurm.output(job), WAIT_S, "the job at work", poll_s=0.1)
    n1.call("job.stop", id=f"slurm-{job}")
    said = wait_until(
        lambda: seen_if(slurm.output(job), lambda o: "restart=1" in o), WAIT_S, "its second run", poll_s=0.1
    )
    saved = [int(line.split("=")[1]) for line in said.splitlines() if line.startswith("saved=")]
    carried = [int(line.split("=")[2]) for line in said.splitlines() if line.startswith("restart=1 from=")]
    assert saved and saved[0] > 0 and carried == [saved[-1]], said
    final = wait_until(lambda: seen_if(slurm.output(job), lambda o: "result=" in o), WAIT_S, "its result", poll_s=0.2)
    assert f"result={STEPS}" in final, final
    wait_until(lambda: slurm.jobs()[job]["job_state"] == "COMPLETED", WAIT_S, "the job completed", poll_s=0.1)


def test_the_evicting_rules_checkpoint_signal_comes_before_the_jobs_own(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter("n1", translators=SLURM_TRANSLATOR, tick_s=1.0, evict_after_s=1.0)
    rule = game_rule("game", own_sleep(GAME)) | {"eviction": {"checkpoint_signal": "B:USR1", "checkpoint_s": 2}}
    n1.add_rule("game", rule)
    path = slurm.root / "job.py"
    # its own script asks for USR2, which it does not handle; the rule's B:USR1 comes first.  It
    # is evicted from a suspension: its signal reaches it only once slurmd has resumed it
    path.write_text(WORKER.format(python=sys.executable, steps=STEPS).replace("B:USR1@30", "B:USR2@30"))
    path.chmod(0o755)
    options = (f"--output={slurm.root}/out-%j.txt", "--open-mode=append", "--nodelist=n1", "--requeue")
    out = slurm.run("sbatch", "--parsable", *options, str(path), str(slurm.root / "saved"))
    job = int(out.strip().split(";")[0])
    wait_until(lambda: adopted(n1, f"slurm-{job}"), WAIT_S, "the job adopted", poll_s=0.1)
    wait_until(lambda: "at=20" in slurm.output(job), WAIT_S, "the job at work", poll_s=0.1)
    g1 = game(n1, 0)
    try:
        # given B:USR1, it saves its work; given its own USR2, it would end unsaved
        wait_until(lambda: "saved=" in slurm.output(job), WAIT_S, "its work saved", poll_s=0.1)
        wait_until(lambda: slurm.jobs()[job]["restart_cnt"] >= 1, WAIT_S, "the job requeued", poll_s=0.1)
    finally:
        end(g1)
    said = wait_until(
        lambda: seen_if(slurm.output(job), lambda o: "restart=1" in o), WAIT_S, "its second run", poll_s=0.1
    )
    saved = [int(line.split("=")[1]) for line in said.splitlines() if line.startswith("saved=")]
    carried = [int(line.split("=")[2]) for line in said.splitlines() if line.startswith("restart=1 from=")]
    assert saved and saved[0] > 0 and carried == [saved[0]], said  # its first run's work, kept
    slurm.run("scancel", str(job), check=False)


#: what a job that requeues itself once it has saved (the common ``trap ... USR1`` pattern)
#: does after saving: its eviction goes on at once, not after the whole checkpoint time
REQUEUE_ITSELF = """    print(f"saved={{done}}", flush=True)
    import subprocess
    subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
"""


def test_a_job_that_requeues_itself_once_saved_runs_again_at_once(slurm: SlurmCluster) -> None:
    # given far longer than it takes to save: only its own requeue ends the wait, and it is
    # placed again as soon as slurmd takes its new start (Slurm alone would wait ~2 minutes)
    n1 = protecting(slurm, "n1", 0, slurm={"checkpoint_s": 300.0})
    path = slurm.root / "job.py"
    script = WORKER.format(python=sys.executable, steps=STEPS)
    path.write_text(script.replace('    print(f"saved={done}", flush=True)\n', REQUEUE_ITSELF.format()))
    path.chmod(0o755)
    options = (f"--output={slurm.root}/out-%j.txt", "--open-mode=append", "--nodelist=n1", "--requeue")
    out = slurm.run("sbatch", "--parsable", *options, str(path), str(slurm.root / "saved"))
    job = int(out.strip().split(";")[0])
    wait_until(lambda: adopted(n1, f"slurm-{job}"), WAIT_S, "the job adopted", poll_s=0.1)
    wait_until(lambda: "at=40" in slurm.output(job), WAIT_S, "the job at work", poll_s=0.1)
    n1.call("job.stop", id=f"slurm-{job}")
    said = wait_until(
        lambda: seen_if(slurm.output(job), lambda o: "restart=1" in o), WAIT_S, "its second run", poll_s=0.1
    )
    saved = [int(line.split("=")[1]) for line in said.splitlines() if line.startswith("saved=")]
    carried = [int(line.split("=")[2]) for line in said.splitlines() if line.startswith("restart=1 from=")]
    assert saved and saved[0] > 0 and carried == [saved[-1]], said
    assert slurm.jobs()[job]["restart_cnt"] == 1, "requeued twice: by itself and again by the node"
    final = wait_until(lambda: seen_if(slurm.output(job), lambda o: "result=" in o), WAIT_S, "its result", poll_s=0.2)
    assert f"result={STEPS}" in final, final


def test_a_job_placed_back_on_the_node_that_evicted_it_runs_there(slurm: SlurmCluster) -> None:
    # the eviction's grace (stop_grace_s) is long, and the requeued job is placed back on n1
    # (the only node it may run on) within it, once protection has ended: the grace was for the
    # run it stopped, and its end must not kill the new one.  Ticks far apart: the new run is
    # adopted and decided on between two looks at the process table, the last one its old run's
    n1 = slurm.start_arbiter(
        "n1", translators=SLURM_TRANSLATOR, tick_s=4.0, evict_after_s=1.0, stop_grace_s=8.0, gpu_release_after_s=0.5
    )
    n1.add_rule("game", game_rule("game", own_sleep(GAME)))
    job = int(slurm.sbatch("sleep 20\n", "--nodelist=n1", "--requeue"))
    wait_until(partial(adopted, n1, f"slurm-{job}"), WAIT_S, "the job adopted", poll_s=0.1)
    g1 = game(n1, 0)
    try:
        wait_until(lambda: n1.events("JOB_STOPPED", f"slurm-{job}"), WAIT_S, "the job evicted", poll_s=0.1)
        evicted = time.monotonic()
    finally:
        end(g1)
    wait_until(
        lambda: slurm.jobs()[job]["restart_cnt"] == 1 and slurm.jobs()[job]["job_state"] == "RUNNING",
        WAIT_S,
        "its new run on n1",
        poll_s=0.1,
    )
    # past the eviction's grace (and two seconds), the new run still runs, and then ends well
    wait_until(lambda: time.monotonic() > evicted + 10.0, 30, "the grace over", poll_s=0.2)
    assert slurm.jobs()[job]["job_state"] == "RUNNING" and running(slurm, job, "n1"), slurm.jobs()[job]
    final = wait_until(
        lambda: seen_if(slurm.jobs()[job], lambda j: j["job_state"] not in LIVE), WAIT_S, "the job ended", poll_s=0.2
    )
    assert final["job_state"] == "COMPLETED" and final["restart_cnt"] == 1, final
