"""The actuator pauses every job a decision holds in one translator call, records them all
before, and keeps one job's failure from stopping the others' pauses."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from arbiter.daemon.act import Actuator
from arbiter.plugin import JobTarget, PluginContext, PluginError, ProcessRef, Translator
from arbiter.pluginmanager import build_plugin_manager
from arbiter.store import PausedJournal
from arbiter_translators.signals import SignalOptions, SignalTranslator


class Counting(SignalTranslator):
    """The signal translator, counting the threads its pauses ran on and failing one job."""

    def __init__(self, context: PluginContext, fail_job: str = "") -> None:
        super().__init__(SignalOptions(), context)
        self.fail_job = fail_job
        self.threads: list[int] = []

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        self.threads.append(threading.get_ident())
        if target.job_id == self.fail_job:
            raise PluginError(f"cannot pause {target.job_id} (on purpose)")
        return super().pause(target)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(6)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def target(job: str, proc: subprocess.Popen[bytes]) -> JobTarget:
    return JobTarget(job, job, (ProcessRef(proc.pid, psutil.Process(proc.pid).create_time()),), None)


def stopped(proc: subprocess.Popen[bytes]) -> bool:
    try:
        return psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def wait_stopped(proc: subprocess.Popen[bytes], want: bool = True) -> bool:
    for _ in range(500):
        if stopped(proc) == want:
            return True
        threading.Event().wait(0.002)
    return False


def actuator(tmp_path: Path, translator: Translator) -> tuple[Actuator, PausedJournal, list[str]]:
    host = build_plugin_manager(entry_points=False)
    journal = PausedJournal(tmp_path / "paused.journal")
    persisted: list[str] = []
    act = Actuator(host, {"pause": ("signal", translator)}, journal, lambda op, es: persisted.extend(f"{op} {e.job_id}" for e in es))
    return act, journal, persisted


def test_every_job_is_paused_in_one_call_and_recorded_first(tmp_path: Path, sleepers) -> None:
    translator = Counting(PluginContext(state_dir=tmp_path))
    act, journal, persisted = actuator(tmp_path, translator)
    targets = [target(f"job-{i}", p) for i, p in enumerate(sleepers)]
    assert act.pause_trees(targets) == {}
    assert all(wait_stopped(p) for p in sleepers)
    assert len(set(translator.threads)) == 1 and len(translator.threads) == len(sleepers)
    assert sorted(PausedJournal.replay(journal.path)) == sorted(e.key for e in act.paused.values())
    assert sorted(persisted) == sorted(f"pause job-{i}" for i in range(len(sleepers)))
    # paused already: nothing more is asked of the translator
    assert act.pause_trees(targets) == {} and len(translator.threads) == len(sleepers)
    assert act.resume_entries(list(act.paused.values())) == []
    assert all(wait_stopped(p, want=False) for p in sleepers)
    assert PausedJournal.replay(journal.path) == {}


def test_one_jobs_failure_leaves_the_others_paused_and_it_on_record(tmp_path: Path, sleepers) -> None:
    translator = Counting(PluginContext(state_dir=tmp_path), fail_job="job-2")
    act, journal, _ = actuator(tmp_path, translator)
    targets = [target(f"job-{i}", p) for i, p in enumerate(sleepers)]
    failed = act.pause_trees(targets)
    assert list(failed) == ["job-2"] and "on purpose" in str(failed["job-2"])
    assert all(wait_stopped(p) for i, p in enumerate(sleepers) if i != 2)
    assert not stopped(sleepers[2])
    # kept on record for a resume, and tried again on the next decision
    assert ("job-2", "tree", sleepers[2].pid) in act.paused
    translator.fail_job = ""
    assert act.pause_trees(targets) == {}
    assert wait_stopped(sleepers[2])
    assert len(translator.threads) == len(sleepers) + 1
    act.resume_entries(list(act.paused.values()))
    assert PausedJournal.replay(journal.path) == {}
