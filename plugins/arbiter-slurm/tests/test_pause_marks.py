"""The daemon and its reflex process each have a Slurm translator of their own, and either may
resume what the other paused: the marks they share say which processes are held paused, and
for which Slurm job."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter.plugin import JobTarget, PluginContext, ProcessRef
from arbiter_slurm import commands
from arbiter_slurm.translator import SlurmTranslator
from arbiter_testing.waiting import wait_until


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The Slurm commands the translators send (none reaches a Slurm)."""
    calls: list[list[str]] = []

    def run(argv: list[str], *args: Any, **kwargs: Any) -> str:
        calls.append(list(argv))
        if argv[0] == "squeue":
            return '{"jobs": []}'
        return ""

    monkeypatch.setattr(commands, "run", run)
    return calls


@pytest.fixture
def job() -> Iterator[ProcessRef]:
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield ProcessRef(proc.pid, psutil.Process(proc.pid).create_time())
    finally:
        proc.kill()
        proc.wait()


def two(tmp_path: Path) -> tuple[SlurmTranslator, SlurmTranslator]:
    return (
        SlurmTranslator(SlurmTranslator.Options(), PluginContext(state_dir=tmp_path)),
        SlurmTranslator(SlurmTranslator.Options(), PluginContext(state_dir=tmp_path)),
    )


@pytest.mark.parametrize("paused_by", ["reflex", "daemon"])
def test_a_resume_by_one_instance_is_not_undone_by_the_others_watcher(
    tmp_path: Path, job: ProcessRef, sent: list[list[str]], paused_by: str
) -> None:
    reflex, daemon = two(tmp_path)
    pauser, resumer = (reflex, daemon) if paused_by == "reflex" else (daemon, reflex)
    try:
        assert pauser.pause(JobTarget("slurm-4242", "job", (job,))) == [job]
        wait_until(lambda: stopped(job.pid), 5, "the job stopped")
        resumer.resume([job])
        wait_until(lambda: not stopped(job.pid), 5, "the job running")
        # the pauser's watcher looks every 10 ms while it holds a pause: it has let it go
        wait_until(lambda: not pauser._paused, 5, "the pauser let it go")
        assert not stopped(job.pid)
        # and the one that resumed it told Slurm, from the mark (nothing in its own memory)
        wait_until(lambda: ["scontrol", "suspend", "4242"] in sent, 5, "the suspend")
        wait_until(lambda: any(c[:2] == ["squeue", "--json"] for c in sent[1:]), 5, "the resume looked at the job")
    finally:
        reflex.close()
        daemon.close()


def test_a_restarted_daemon_resumes_the_slurm_job_it_paused_before(
    tmp_path: Path, job: ProcessRef, sent: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    before, _ = two(tmp_path)
    before.pause(JobTarget("slurm-77_3", "job", (job,)))
    before.close()
    looked: list[str] = []
    monkeypatch.setattr(SlurmTranslator, "_resume", lambda self, work: looked.append(work.job))
    after = SlurmTranslator(SlurmTranslator.Options(), PluginContext(state_dir=tmp_path))
    try:
        after.resume([job])  # its environment names no job: the mark does
        wait_until(lambda: looked == ["77_3"], 5, "the resume sent to Slurm job 77_3")
        assert not after._marks.held(job)
    finally:
        after.close()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_slurm_job_paused_by_the_daemon_and_resumed_by_the_reflex_process_runs(slurm: Any, tmp_path: Path) -> None:
    from arbiter_testing.rules import own_sleep, phase_rule

    events = tmp_path / "events.jsonl"
    events.touch()
    n1 = slurm.start_arbiter("n1", translators={"pause": ["slurm"], "terminate": ["slurm"]}, tick_s=1.0)
    n1.add_rule("p", phase_rule("p", own_sleep(977000), events, on=["busy"]))
    n1.spawn(own_sleep(977000).split())

    def say(value: str) -> None:
        with open(events, "a") as fh:
            fh.write(json.dumps({"event": "status", "phase": value}) + "\n")

    # the job starts while the phase is on: the daemon pauses it as it adopts it (its own
    # translator), and the reflex process, armed with that pause, resumes it as the phase ends
    say("busy")
    n1.events("PROTECTION_PHASE_ON")
    job = int(slurm.sbatch("sleep 120\n", "--nodelist=n1"))
    wait_until(lambda: slurm.jobs()[job]["job_state"] == "SUSPENDED", 60, "suspended", poll_s=0.1)
    wait_until(lambda: n1.status()["fast_path"]["reflex_process"]["sources"], 30, "the reflex process watching")
    suspended = time.time()
    # each decision arms the reflex process with what it paused: one made since has
    wait_until(lambda: n1.status()["decided_at"] > suspended + 1, 30, "the reflex process armed with its pause")
    say("idle")
    wait_until(
        lambda: slurm.jobs()[job]["job_state"] == "RUNNING" and not stopped_in(slurm, job),
        30,
        "the job running in Slurm and here",
        poll_s=0.1,
    )
    slurm.run("scancel", str(job), check=False)


def stopped_in(slurm: Any, job: int) -> bool:
    out = slurm.run("scontrol", "listpids", str(job), "n1", check=False)
    pids = [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]
    return not pids or any(psutil.pid_exists(p) and stopped(p) for p in pids)
