"""The actuator pauses every job a decision holds in one translator call, records them all
before, and keeps one job's failure from stopping the others' pauses."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter.plugin import JobTarget, PluginContext, PluginError, ProcessRef, Translator
from arbiter.pluginmanager import build_plugin_manager
from arbiter.reflex.act import Actuator
from arbiter.state.journal import PausedEntry, PausedJournal
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
    act = Actuator(
        host,
        {"pause": ("signal", translator)},
        journal,
        lambda op, es: persisted.extend(f"{op} {e.job_id}" for e in es),
    )
    return act, journal, persisted


def test_every_job_is_paused_in_one_call_and_recorded_first(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
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


def test_one_jobs_failure_leaves_the_others_paused_and_it_on_record(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
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


def test_targets_prepared_ahead_are_paused_with_what_was_made_for_them(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # fifty jobs' entries and journal rows, made on the way to the first signal, were a
    # millisecond under load: the decision makes them ahead
    import arbiter.reflex.act as act_module

    act, journal, _ = actuator(tmp_path, Counting(PluginContext(state_dir=tmp_path)))
    targets = [target(f"job-{i}", p) for i, p in enumerate(sleepers)]
    act.prepare(targets)
    made: list[object] = []

    def counted(*fields: Any) -> PausedEntry:
        made.append(fields)
        return PausedEntry(*fields)

    monkeypatch.setattr(act_module, "PausedEntry", counted)
    assert act.pause_trees(targets[:3]) == {}
    assert made == [] and all(wait_stopped(p) for p in sleepers[:3])
    # one made anew (equal, but not the one prepared) is paused all the same, its entries made now
    again = JobTarget(targets[3].job_id, targets[3].name, targets[3].processes, None)
    assert act.pause_trees([again]) == {} and len(made) == 1 and wait_stopped(sleepers[3])
    assert sorted(PausedJournal.replay(journal.path)) == sorted(act.paused) and len(act.paused) == 4
    assert act.resume_entries(list(act.paused.values())) == []
    act.prepare(targets[4:])  # the others are forgotten
    assert act.pause_trees([targets[0], targets[4]]) == {} and len(made) == 2  # the forgotten one's made now
    assert act.resume_entries(list(act.paused.values())) == []
    assert PausedJournal.replay(journal.path) == {}


@pytest.mark.parametrize("bounded", [True, False])
def test_a_translator_that_bounds_its_own_time_pauses_and_resumes_on_the_deciding_thread(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], bounded: bool
) -> None:
    """No hand-off to a plugin thread for a bounded translator (the hand-off waited for the
    interpreter lock and a CPU under load); any other keeps its timeout on a pool thread."""

    class Resuming(Counting):
        def resume(self, refs: Sequence[ProcessRef]) -> None:
            self.threads.append(threading.get_ident())
            return super().resume(refs)

    translator = Resuming(PluginContext(state_dir=tmp_path))
    translator.bounded = bounded  # type: ignore[misc]
    act, _, _ = actuator(tmp_path, translator)
    assert act.pause_trees([target("job-0", sleepers[0])]) == {}
    assert act.resume_entries(list(act.paused.values())) == []
    here = threading.get_ident()
    assert len(translator.threads) == 2
    assert (set(translator.threads) == {here}) if bounded else (here not in translator.threads)


def test_a_bounded_translator_that_fails_outside_any_job_is_isolated_and_its_jobs_stay_on_record(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    class Broken(Counting):
        bounded = True

        def resume(self, refs: Sequence[ProcessRef]) -> None:
            raise RuntimeError("the resume broke (on purpose)")

    act, _, _ = actuator(tmp_path, Broken(PluginContext(state_dir=tmp_path)))
    assert act.pause_trees([target("job-0", sleepers[0])]) == {}
    failures = act.resume_entries(list(act.paused.values()))
    assert len(failures) == 1 and "RuntimeError: the resume broke" in failures[0]
    assert ("job-0", "tree", sleepers[0].pid) in act.paused  # the next decision tries again


class Ordered(Counting):
    """Notes, as each pause is asked for, which jobs had stopped by then."""

    def __init__(self, context: PluginContext, procs: dict[str, subprocess.Popen[bytes]], fail_job: str = "") -> None:
        super().__init__(context, fail_job)
        self.procs = procs
        self.seen: list[tuple[str, list[str]]] = []
        self.settled: list[tuple[tuple[int, ...], bool]] = []

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        self.seen.append((target.job_id, sorted(j for j, p in self.procs.items() if stopped(p))))
        return super().pause(target)

    def settle(self, refs: Sequence[ProcessRef], timeout_s: float) -> bool:
        settled = super().settle(refs, timeout_s)
        self.settled.append((tuple(r.pid for r in refs), settled))
        return settled


def test_the_first_job_has_stopped_before_the_others_are_signalled(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import arbiter.reflex.act as act_module

    monkeypatch.setattr(act_module, "FIRST_STOP_S", 5.0)  # a bound, not a wait: it returns once stopped
    procs = {f"job-{i}": p for i, p in enumerate(sleepers)}
    translator = Ordered(PluginContext(state_dir=tmp_path), procs)
    act, journal, _ = actuator(tmp_path, translator)
    made: list[str] = []

    def targets() -> Iterator[JobTarget]:
        for job, proc in procs.items():
            made.append(job)
            yield target(job, proc)

    before = time.monotonic()
    first_at = act.pause_in_turn(targets())
    assert first_at is not None and before <= first_at <= time.monotonic()
    assert translator.seen[0] == ("job-0", [])
    assert translator.seen[1] == ("job-1", ["job-0"]) and all("job-0" in then for _, then in translator.seen[2:])
    assert [j for j, _ in translator.seen] == list(procs) == made
    assert translator.settled == [((sleepers[0].pid,), True)]  # it waited, and saw the first stopped
    assert all(wait_stopped(p) for p in sleepers)
    assert sorted(PausedJournal.replay(journal.path)) == sorted(act.paused) and len(act.paused) == len(sleepers)
    assert act.pause_in_turn([]) is None


def test_no_wait_for_one_job_alone_a_first_pause_that_failed_or_a_translator_that_does_not_bound_its_time(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    procs = {f"job-{i}": p for i, p in enumerate(sleepers)}
    translator = Ordered(PluginContext(state_dir=tmp_path), procs, fail_job="job-0")
    act, _, _ = actuator(tmp_path, translator)
    act.pause_in_turn([target("job-5", sleepers[5])])
    act.pause_in_turn([target(j, procs[j]) for j in ("job-0", "job-1", "job-2")])  # the first one fails
    assert translator.settled == []
    assert all(wait_stopped(p) for p in sleepers[1:3]) and ("job-0", "tree", sleepers[0].pid) in act.paused
    translator.fail_job, translator.bounded = "", False  # type: ignore[misc]
    act.pause_in_turn([target(j, procs[j]) for j in ("job-3", "job-4")])
    assert translator.settled == [] and all(wait_stopped(p) for p in sleepers[3:5])


def test_in_the_reflex_process_a_job_alone_is_waited_for_right_after_its_signal_before_its_record(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever runs between its signal and the wait takes the core the job may need to stop:
    the record of its pause is made once it has stopped (the journal row, as always, before
    the signal)."""
    import arbiter.reflex.act as act_module

    monkeypatch.setattr(act_module, "FIRST_STOP_S", 5.0)  # a bound, not a wait: it returns once stopped
    procs = {"job-0": sleepers[0], "job-1": sleepers[1]}
    translator = Ordered(PluginContext(state_dir=tmp_path), procs)
    act, journal, persisted = actuator(tmp_path, translator)
    then: list[list[str]] = []
    settle = translator.settle

    def settled(refs: Sequence[ProcessRef], timeout_s: float) -> bool:
        then.append(list(persisted))
        return settle(refs, timeout_s)

    translator.settle = settled  # type: ignore[method-assign]
    first_at = act.pause_in_turn([target("job-0", sleepers[0])], alone_too=True)
    assert first_at is not None and then == [[]] and translator.settled == [((sleepers[0].pid,), True)]
    assert persisted == ["pause job-0"] and ("job-0", "tree", sleepers[0].pid) in PausedJournal.replay(journal.path)
    act.pause_in_turn([target("job-1", sleepers[1])])  # the decision thread's: a job alone is not waited for
    assert len(translator.settled) == 1 and wait_stopped(sleepers[1])


def test_a_settle_that_fails_still_lets_the_others_be_paused(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    class Failing(Counting):
        def settle(self, refs: Sequence[ProcessRef], timeout_s: float) -> bool:
            raise RuntimeError("settle broke (on purpose)")

    act, _, _ = actuator(tmp_path, Failing(PluginContext(state_dir=tmp_path)))
    assert act.pause_in_turn([target(f"job-{i}", p) for i, p in enumerate(sleepers)]) is not None
    assert all(wait_stopped(p) for p in sleepers) and len(act.paused) == len(sleepers)


def test_no_pause_translator_leaves_the_others_to_the_decision_without_an_error(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    host = build_plugin_manager(entry_points=False)
    act = Actuator(host, {}, PausedJournal(tmp_path / "paused.journal"), lambda op, es: None)
    nothing = JobTarget("job-0", "job-0", (), None)  # nothing left to pause: no translator asked for
    assert act.pause_in_turn([nothing, target("job-1", sleepers[1])]) is not None
    assert not stopped(sleepers[1]) and act.paused == {}
