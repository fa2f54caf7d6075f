"""Slurm jobs become arbiter jobs: through the TaskProlog as they start, through reconciling
against squeue and scontrol listpids when a hook was missed, and they end through the Epilog.
Against a real slurmctld and slurmd on loopback (see :mod:`arbiter_testing.slurm`)."""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Any

import pytest

from arbiter.api.transport import RequestRefused
from arbiter_slurm import hooks
from arbiter_testing import run_as
from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(240)]

WAIT_S = 60.0


def _job(node: Any, job_id: str) -> dict[str, Any] | None:
    return next((j for j in node.status()["jobs"] if j["id"] == job_id), None)


def test_a_batch_job_is_handed_over_by_its_task_prolog_and_ended_by_the_epilog(slurm: SlurmCluster) -> None:
    # ticks far apart: the job is known, and ends, through the hooks alone, not by reconciling
    # or by the tick noticing its processes gone
    n1 = slurm.start_arbiter("n1", tick_s=60)
    job = slurm.sbatch('echo "id=$ARBITER_JOB_ID control=$ARBITER_CONTROL"\nsleep 300\n', "--nodelist=n1")
    key = f"slurm-{job}"
    seen = wait_until(lambda: _job(n1, key), WAIT_S, f"{key} in n1's status", poll_s=0.1)
    assert seen["state"] == "run", seen
    n1.events("JOB_ADOPTED", key, contains="handed over")
    # the task was told who it is to arbiter, before its first line ran
    out = wait_until(lambda: slurm.output(job), WAIT_S, "the job's output")
    assert f"id={key} " in out and "control=" in out and "/jobs/" in out, out
    # the arbiter job is the task itself: its tree holds the batch script's sleep
    pids = wait_until(lambda: (_job(n1, key) or {}).get("pids"), WAIT_S, "the job's processes", poll_s=0.1)
    assert pids, _job(n1, key)

    slurm.run("scancel", str(job))
    wait_until(lambda: _job(n1, key) is None, WAIT_S, f"{key} gone from n1's status", poll_s=0.1)
    n1.events("JOB_EXITED", key, contains="its command exited")  # told by the Epilog


def test_a_job_started_while_the_daemon_was_down_is_adopted_from_squeue(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(
        "sleep 300\n", "--nodelist=n2", "--comment=arbiter:" + '{"name": "render", "gpu": {"use": "shared"}}'
    )
    wait_until(lambda: slurm.jobs().get(job, {}).get("job_state") == "RUNNING", WAIT_S, "the job running")
    wait_until(lambda: "sleep 300" in _task_tree(slurm, job, "n2"), WAIT_S, "the job's script started")
    n2 = slurm.start_arbiter("n2")
    key = f"slurm-{job}"
    seen = wait_until(lambda: _job(n2, key), WAIT_S, f"{key} adopted by n2", poll_s=0.1)
    assert seen["name"] == "render", seen  # the manifest in the job's comment
    n2.events("JOB_ADOPTED", key, contains="reconciling")


def test_the_hook_exits_0_and_says_why_when_the_daemon_is_not_there(slurm: SlurmCluster) -> None:
    job = slurm.sbatch('echo "id=[$ARBITER_JOB_ID]"\n', "--nodelist=n1")
    wait_until(lambda: "id=" in slurm.output(job), WAIT_S, "the job's output")
    out = slurm.output(job)
    assert "id=[]" in out, out  # it ran, unknown to arbiter
    assert "arbiter-slurm taskprolog: job" in out and "runs without arbiter knowing it" in out, out
    # the Prolog and Epilog failed to reach the daemon too, and the node is not drained for it
    wait_until(lambda: slurm.node_states()["n1"] == "idle", WAIT_S, "n1 idle again, not drained", poll_s=0.1)


def _task_tree(slurm: SlurmCluster, job: int, node: str) -> str:
    out = slurm.run("scontrol", "listpids", str(job), node, check=False)
    cmdlines = []
    for line in out.splitlines()[1:]:
        pid = line.split()[0]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdlines.append(fh.read().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return "\n".join(cmdlines) + os.linesep


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _all(pids: list[int], states: str) -> bool:
    """Whether every one of the job's processes that is still there is in one of ``states``
    (one that has ended since, such as a step's short-lived helper, is not waited for)."""
    seen = [s for s in map(_state, pids) if s not in ("gone", "Z")]
    return bool(seen) and all(s in states for s in seen)


def test_a_slurm_job_is_held_while_a_protected_program_uses_the_gpu(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter("n1")
    marker = f"arbiter.demo.protected --events {slurm.root / 'p.jsonl'}"
    n1.add_rule("prot", {"id": "prot", "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}})
    job = slurm.sbatch("sleep 300\n", "--nodelist=n1")
    key = f"slurm-{job}"
    pids = wait_until(lambda: (_job(n1, key) or {}).get("pids"), WAIT_S, f"{key}'s processes", poll_s=0.1)
    assert _all(pids, "SR")

    protected = n1.spawn([sys.executable, "-m", "arbiter.demo.protected", "--events", str(slurm.root / "p.jsonl")])
    try:
        wait_until(lambda: _all(pids, "Tt"), WAIT_S, "the Slurm job's processes stopped")
        # the status is published just after the signals are sent: a moment after the stop
        (item,) = n1.wait_for(
            lambda: (items := n1.call("explain", subject=key)["explain"]["items"])[0]["state"] == "paused" and items
        )
        assert item["reasons"][0]["code"] == "PROTECTED_GPU_BUSY", item
        # by Slurm's own job id, as squeue shows it
        assert [i["id"] for i in n1.call("explain", subject=str(job))["explain"]["items"]] == [key]
    finally:
        protected.terminate()
        protected.wait()
    wait_until(lambda: _all(pids, "SR"), WAIT_S, "the Slurm job's processes running again")


SLURM_TRANSLATOR = {"pause": ["slurm"], "terminate": ["slurm"]}


def test_the_slurm_translator_pauses_where_the_scheduler_sees_it(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter("n1", translators=SLURM_TRANSLATOR)
    marker = f"arbiter.demo.protected --events {slurm.root / 'p.jsonl'}"
    n1.add_rule("prot", {"id": "prot", "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}})
    job = slurm.sbatch("sleep 300\n", "--nodelist=n1")
    key = f"slurm-{job}"
    pids = wait_until(lambda: (_job(n1, key) or {}).get("pids"), WAIT_S, f"{key}'s processes", poll_s=0.1)

    protected = n1.spawn([sys.executable, "-m", "arbiter.demo.protected", "--events", str(slurm.root / "p.jsonl")])
    try:
        wait_until(lambda: _all(pids, "Tt"), WAIT_S, "the job's processes stopped here")
        wait_until(lambda: slurm.jobs()[job]["job_state"] == "SUSPENDED", WAIT_S, "the job S in squeue", poll_s=0.1)
    finally:
        protected.terminate()
        protected.wait()
    wait_until(lambda: slurm.jobs()[job]["job_state"] == "RUNNING", WAIT_S, "the job R in squeue", poll_s=0.1)
    wait_until(lambda: _all(pids, "SR"), WAIT_S, "the job's processes running again")


def test_a_stopped_requeueable_job_runs_again_and_a_plain_one_ends(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter("n1", translators=SLURM_TRANSLATOR)
    again = slurm.sbatch('echo "restart=$SLURM_RESTART_COUNT"\nsleep 300\n', "--nodelist=n1", "--requeue")
    once = slurm.sbatch("sleep 300\n", "--nodelist=n1", "--no-requeue")
    for job in (again, once):
        wait_until(partial(_job, n1, f"slurm-{job}"), WAIT_S, f"slurm-{job} adopted", poll_s=0.1)
    n1.call("job.stop", id=f"slurm-{again}")
    n1.call("job.stop", id=f"slurm-{once}")
    wait_until(lambda: "restart=1" in slurm.output(again), WAIT_S, "the requeued job running again", poll_s=0.2)
    ended = wait_until(
        lambda: (
            slurm.jobs()[once]["job_state"] not in ("RUNNING", "SUSPENDED", "PENDING", "COMPLETING")
            and slurm.jobs()[once]["job_state"]
        ),
        WAIT_S,
        "the job that may not be requeued ended",
        poll_s=0.2,
    )
    assert ended in ("CANCELLED", "FAILED", "COMPLETED"), ended
    assert slurm.jobs()[once]["restart_cnt"] == 0
    assert slurm.jobs()[again]["restart_cnt"] == 1


def test_arbiter_job_run_inside_a_batch_script_is_the_same_job(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter("n1")
    config = slurm.configs / "n1.yaml"
    script = (
        f'{sys.executable} -m arbiter job run --config {config} -- sh -c "echo inside=\\$ARBITER_JOB_ID; sleep 300"\n'
    )
    job = slurm.sbatch(script, "--nodelist=n1")
    key = f"slurm-{job}"

    def said() -> str | None:
        out = slurm.output(job)
        return out if "inside=" in out else None

    out = wait_until(said, WAIT_S, "the command's output")
    assert f"inside={key}" in out and f"running inside job {key}" in out, out
    assert [j["id"] for j in n1.status()["jobs"]] == [key]


def test_a_task_prolog_run_by_hand_with_another_users_job_id_takes_over_nothing(slurm: SlurmCluster) -> None:
    """``nobody`` runs the shipped TaskProlog with root's ``SLURM_JOB_ID``: refused, for a job
    the daemon knows (it is root's) and for one it does not know yet (Slurm does not say it is
    nobody's), and root's job keeps its process (before, nobody's process became the job and
    the reconciler took it back, over and over)."""
    n1 = slurm.start_arbiter("n1")
    known = slurm.sbatch("sleep 300\n", "--nodelist=n1")
    elsewhere = slurm.sbatch("sleep 300\n", "--nodelist=n2")  # no daemon on n2: n1 knows nothing of it
    key = f"slurm-{known}"
    seen = wait_until(lambda: _job(n1, key), WAIT_S, f"{key} in n1's status", poll_s=0.1)
    assert seen["owner_uid"] == 0, seen
    wait_until(lambda: slurm.jobs().get(elsewhere, {}).get("job_state") == "RUNNING", WAIT_S, "the job on n2 running")

    def task_prolog(job: int) -> str:
        forged = slurm.env(SLURM_JOB_ID=str(job), SLURMD_NODENAME="n1", ARBITER_MANIFEST='{"name": "x"}')
        try:  # the hook's own code, as nobody, handing over itself as the job's task
            return "\n".join(hooks.taskprolog(forged, os.getpid()))
        except hooks.HookError as exc:
            return f"refused: {exc}"

    said = run_as("nobody", lambda: task_prolog(known))
    assert said.startswith("refused:") and "belongs to uid 0" in said, said
    said = run_as("nobody", lambda: task_prolog(elsewhere))
    assert said.startswith("refused:") and "no scheduler vouches" in said and "on this node" in said, said
    after = _job(n1, key)
    assert after is not None and after["owner_uid"] == 0, after
    assert _job(n1, f"slurm-{elsewhere}") is None
    assert not n1.call("timeline", code="JOB_EXITED", subject=key)["events"]


def _paused(node: Any, key: str) -> dict[str, Any] | None:
    """The job's explain item once it is paused (None before it is known, or while it runs)."""
    try:
        (item,) = node.call("explain", subject=key)["explain"]["items"]
    except RequestRefused:
        return None
    return item if item["state"] == "paused" else None


def test_a_job_that_starts_while_its_node_protects_does_no_work_there(slurm: SlurmCluster) -> None:
    # placed as a node ends one protection and starts the next, a job starts on a node that
    # protects: its task is stopped while it waits for its TaskProlog, before the job's
    # script runs at all (each step it takes is a line in a file)
    n1 = slurm.start_arbiter("n1", translators=SLURM_TRANSLATOR)
    marker = f"arbiter.demo.protected --events {slurm.root / 'p.jsonl'}"
    n1.add_rule("prot", {"id": "prot", "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}})
    steps = slurm.root / "steps"
    protected = n1.spawn([sys.executable, "-m", "arbiter.demo.protected", "--events", str(slurm.root / "p.jsonl")])
    try:
        n1.job_run([sys.executable, "-c", "import time; time.sleep(300)"], "--name", "guard")
        n1.reasons("guard", "PROTECTED_GPU_BUSY")  # the node protects
        job = slurm.sbatch(f"while :; do echo step >> {steps}; sleep 0.05; done\n", "--nodelist=n1")
        item = wait_until(partial(_paused, n1, f"slurm-{job}"), WAIT_S, "the job held", poll_s=0.05)
        assert item["reasons"][0]["code"] == "PROTECTED_GPU_BUSY", item
        wait_until(lambda: slurm.jobs()[job]["job_state"] == "SUSPENDED", WAIT_S, "the job S in squeue", poll_s=0.1)
        assert not steps.exists(), f"the job took {len(steps.read_text().split())} step(s) on a protected node"
    finally:
        protected.terminate()
        protected.wait()
    wait_until(steps.exists, WAIT_S, "the job working once the node is free", poll_s=0.1)
    # its output says why it waited
    wait_until(lambda: "held on this node" in slurm.output(job), WAIT_S, "the job's output saying it was held")
    assert "PROTECTED_GPU_BUSY" in slurm.output(job), slurm.output(job)
