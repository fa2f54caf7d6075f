"""The reflex runs beside the decision, on the thread that read the change: a phase change
pauses work while a decision is still being made, and that decision, made on the phase
before, is made again rather than undo it.  These daemons run their reflex inside (no
reflex process), but for the first test, which holds for the reflex process too."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

import arbiter.daemon.decider as decider
import arbiter.daemon.fastpath as fastpath
from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.daemon.inbox import SourceReport
from arbiter.engine.decide import decide as engine_decide
from arbiter.plugin import SourceState
from arbiter_testing.node import HarnessNode
from arbiter_testing.rules import phase_rule
from arbiter_testing.waiting import wait_until


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": value}) + "\n")


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def stopped_within(pid: int, timeout: float = 10.0) -> float:
    """Wait until the job ``pid`` is stopped; how long it took."""
    started = time.monotonic()
    wait_until(lambda: stopped(pid), timeout, f"pid {pid} to be stopped", poll_s=0.002)
    return time.monotonic() - started


def continued(pid: int, timeout: float = 10.0) -> None:
    wait_until(lambda: not stopped(pid), timeout, f"pid {pid} to be continued", poll_s=0.002)


def sources_taken(daemon: Daemon, monkeypatch: Any) -> list[tuple[str, str | None]]:
    """From now on, each source report taken: (the thread that took it, its phase)."""
    taken: list[tuple[str, str | None]] = []
    real_take = daemon.fast.take

    def take(batch: Any) -> Any:
        taken.extend((threading.current_thread().name, r.state.phase) for r in batch if isinstance(r, SourceReport))
        return real_take(batch)

    monkeypatch.setattr(daemon.fast, "take", take)
    return taken


def slow_reflex_thread(monkeypatch: Any) -> threading.Event:
    """The reports thread takes the batch it waits for now at once; each batch after that,
    once fetched, waits until the event returned is set."""
    real_drained = fastpath.drained
    late = threading.Event()

    def drained(inbox: Any) -> Any:
        batch = real_drained(inbox)
        late.wait(10)
        return batch

    monkeypatch.setattr(fastpath, "drained", drained)
    return late


@contextmanager
def running(
    tmp_path: Path, tick_s: float, n: int, reflex_process: bool = False
) -> Iterator[tuple[HarnessNode, Daemon, Path, int]]:
    """An in-process daemon with an immediate rule protecting ``sleep 1000+n`` by a JSONL
    phase, that program running and seen, and a job ``j`` (``sleep 3000+n``) started:
    (node, daemon, the phase file, the job's pid)."""
    events = tmp_path / "phase.jsonl"
    events.touch()
    node = HarnessNode(tmp_path, tick_s=tick_s, reflex_process=reflex_process)
    node.add_rule(
        "p",
        phase_rule("p", f"sleep {1000 + n}", events, scope="all"),
    )
    config, _ = load_node_config(node.config_path)
    daemon = Daemon(config, node.config_path)
    daemon.start()
    try:
        node.spawn(["sleep", str(1000 + n)])
        node.job_run(["sleep", str(3000 + n)], "--name", "j")
        pid = node.job_pid("j", timeout=30)
        daemon.request_reload()  # a tick now: the protected program is seen
        node.wait_for(lambda: daemon.snapshot.obs is not None and daemon.snapshot.obs.rules["p"].running, timeout=30)
        if reflex_process:  # the process watches the phase, and a decision has armed it
            node.wait_for(lambda: daemon.latency_figures()["reflex_process"]["sources"] == 1, timeout=30)
            daemon.notify_jobs()
            # an arm for the source is sent under the signalling lock, which the process waits
            # for before it acts: once sent, the process acts on it (or on a later one)
            link = daemon.fast.linked.link if daemon.fast.linked else None
            assert link is not None
            wait_until(lambda: link._arm, 30, "a decision to arm the reflex process for the source")
        yield node, daemon, events, pid
    finally:
        daemon.shutdown()
        node.close()


@pytest.mark.parametrize("reflex_process", [False, True], ids=["inside", "reflex-process"])
def test_a_phase_pauses_while_a_decision_is_made_and_that_decision_never_undoes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reflex_process: bool
) -> None:
    # a long tick: the decisions here are the test's
    with running(tmp_path, 5, 3, reflex_process) as (node, daemon, events, pid):
        real = engine_decide
        held, entered = threading.Event(), threading.Event()
        first = [True]

        def slow_decide(*args: Any) -> Any:
            decision = real(*args)
            if first[0]:  # the next decision is made on the phase off, then held
                first[0] = False
                entered.set()
                held.wait(10)
            return decision

        resumes: list[float] = []
        real_resume = daemon.actuator.resume_entries

        def resume_entries(entries: Any) -> list[str]:
            resumes.append(time.monotonic())
            return real_resume(entries)

        monkeypatch.setattr(decider, "decide", slow_decide)
        monkeypatch.setattr(daemon.actuator, "resume_entries", resume_entries)
        daemon.notify_jobs()
        assert entered.wait(10)

        phase(events, "on")
        # the decision is held for 10 s: a reflex that waited for it would take that long
        took = stopped_within(pid, timeout=5)
        print(f"\nphase on -> job stopped, a decision held meanwhile: {1000 * took:.1f} ms")

        redecisions, decisions = daemon.costs["redecisions"], daemon.costs["decisions"]
        held.set()  # the held decision said "run": carried out, it would continue the job
        node.wait_for(lambda: daemon.costs["redecisions"] > redecisions, timeout=10)
        job_id = node.known_job("j")["id"]

        def paused() -> bool:
            decision = daemon.snapshot.decision
            return decision is not None and decision.jobs[job_id].state == "paused"

        node.wait_for(paused, timeout=10)
        # the batch the held decision was made in is done: what it would have done, it has
        wait_until(lambda: daemon.costs["decisions"] > decisions, 10, "the held decision's batch to end")
        assert stopped(pid) and resumes == []  # never continued, not even for a moment

        phase(events, "off")
        continued(pid)
        if reflex_process:  # the reflex process continued it, and the daemon's record says so
            node.wait_for(lambda: daemon.latency_figures()["reflex_process"]["armed"] >= 2, timeout=5)
            node.wait_for(lambda: not daemon.actuator.paused, timeout=5)
        else:
            assert len(resumes) >= 1


def test_a_decision_that_may_not_be_made_again_holds_the_reflex_off_and_is_carried_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``REDECIDE_AT_MOST`` tries (here at once) a decision is made under the lock,
    the reflex waiting for it: a source flapping faster than decisions never starves them."""
    monkeypatch.setattr(decider, "REDECIDE_AT_MOST", 0)
    with running(tmp_path, 0.2, 4) as (_node, daemon, events, pid):
        phase(events, "on")
        stopped_within(pid)
        phase(events, "off")
        continued(pid)
        assert daemon.costs["redecisions"] == 0


def test_each_decision_makes_every_jobs_target_so_the_reflex_finds_them_made(tmp_path: Path) -> None:
    # with fifty jobs, making their targets (and paused entries) in the reflex came before its first signal
    with running(tmp_path, 5, 5) as (node, daemon, events, pid):

        def made_for_this_view() -> tuple[Any, dict[Any, Any]] | None:
            # read together: the daemon's next decision replaces the targets and what it prepared
            view, made = daemon.targets._made
            prepared = daemon.actuator._prepared
            if view is not daemon.snapshot.view or not {r.id for r in daemon.jobs.active()} <= {k[0] for k in made}:
                return None
            if not all(prepared.get(id(t), (None,))[0] is t for t in made.values()):
                return None
            return view, dict(made)

        view, before = node.wait_for(made_for_this_view)
        phase(events, "on")
        stopped_within(pid)
        if daemon.targets._made[0] is view:  # no tick came between: the reflex made nothing new
            assert daemon.targets._made[1].keys() == before.keys()
            assert all(daemon.targets._made[1][key] is target for key, target in before.items())


def test_a_phase_change_is_acted_on_by_the_thread_that_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a hand-off to another thread cost a wake-up (half a millisecond and more under load)
    with running(tmp_path, 5, 6) as (_node, daemon, events, pid):
        pausing: list[str] = []
        real = daemon.actuator.pause_trees

        def pause_trees(targets: Any) -> Any:
            if targets:  # every decision's act calls it, most with nothing to pause (a tick may come)
                pausing.append(threading.current_thread().name)
            return real(targets)

        monkeypatch.setattr(daemon.actuator, "pause_trees", pause_trees)
        phase(events, "on")
        stopped_within(pid)
        assert pausing[0].startswith("arbiter-jsonl:"), pausing  # the source's own watcher


def test_the_reflex_pauses_its_first_job_alone_then_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the job using the most GPU time stops first; fifty others' targets and journal rows
    # made before its signal took half a millisecond
    with running(tmp_path, 5, 8) as (node, daemon, events, pid):
        node.job_run(["sleep", "3108"], "--name", "k")
        other = node.job_pid("k", timeout=30)
        node.wait_for(
            lambda: (
                daemon.snapshot.decision is not None
                and len(daemon.snapshot.decision.jobs) == 2
                and all(v.state == "run" for v in daemon.snapshot.decision.jobs.values())
            ),
            timeout=30,
        )
        calls: list[list[str]] = []
        real = daemon.actuator.pause_trees

        def pause_trees(targets: Any) -> Any:
            if threading.current_thread().name.startswith("arbiter-jsonl:"):
                calls.append([t.job_id for t in targets])
            return real(targets)

        monkeypatch.setattr(daemon.actuator, "pause_trees", pause_trees)
        phase(events, "on")
        wait_until(lambda: stopped(pid) and stopped(other), 10, "both jobs to be stopped", poll_s=0.002)
        assert [len(c) for c in calls] == [1, 1] and calls[0] != calls[1], calls


def test_reports_queued_while_the_lock_was_held_are_taken_before_newer_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report that meets the lock held waits for the reports thread; one made after it, with
    the lock free again, must not overtake it (here: on, then off, must end running)."""
    with running(tmp_path, 5, 7) as (node, daemon, events, pid):
        taken = sources_taken(daemon, monkeypatch)
        late = slow_reflex_thread(monkeypatch)
        with daemon.fast.lock:  # a report of no helper, queued: the reports thread's next wait is the slow one
            daemon.helper_gone((0, 0))
        node.wait_for(lambda: not daemon.fast._queued, timeout=5)
        with daemon.fast.lock:
            phase(events, "on")
            node.wait_for(lambda: daemon.fast._queued[("p", 0)] == 1, timeout=5)
        phase(events, "off")
        node.wait_for(
            lambda: daemon.fast._queued[("p", 0)] == 2, timeout=5
        )  # queued behind "on", though the lock is free
        assert taken == [] and not stopped(pid)
        late.set()
        node.wait_for(lambda: len(taken) == 2, timeout=5)
        assert [p for _, p in taken] == ["on", "off"] and {t for t, _ in taken} == {"reports"}
        # the reports thread lets go of its queue's count once it has acted on the batch
        wait_until(lambda: not daemon.fast._queued, 10, "the reports thread to act on both reports")
        assert not stopped(pid)


def test_a_report_is_held_back_only_by_older_reports_of_its_own_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper's report queued while the lock was held does not make a phase change wait
    for the reports thread: the source's watcher pauses the job itself."""
    with running(tmp_path, 5, 9) as (node, daemon, events, pid):
        taken = sources_taken(daemon, monkeypatch)
        late = slow_reflex_thread(monkeypatch)
        with daemon.fast.lock:  # taken by the reports thread, whose next wait is the slow one
            daemon.helper_gone((0, 0))
        node.wait_for(lambda: not daemon.fast._queued, timeout=5)
        with daemon.fast.lock:
            daemon.helper_gone((1, 1))
        assert daemon.fast._queued == {(1, 1): 1}
        phase(events, "on")
        stopped_within(pid)
        assert [(t.split(":")[0], p) for t, p in taken] == [("arbiter-jsonl", "on")]
        assert daemon.fast._queued == {(1, 1): 1}  # still waiting, overtaken by another origin's report
        late.set()
        node.wait_for(lambda: not daemon.fast._queued, timeout=5)


def test_a_report_that_comes_once_the_daemon_is_stopping_pauses_nothing(tmp_path: Path) -> None:
    # the shutdown resumes what is paused: a pause after that would be left in place
    with running(tmp_path, 5, 8) as (_node, daemon, _events, pid):
        daemon.request_stop()
        daemon.fast.on_source("p", 0, SourceState(readable=True, phase="on", changed_at=time.monotonic()))
        # queued, if anywhere, for the reports thread: once it and the decision thread have
        # ended, nothing is left to act on the report before the shutdown
        wait_until(lambda: not any(t.is_alive() for t in daemon._threads), 10, "the daemon's threads to end")
        assert not stopped(pid) and not daemon.actuator.paused


def test_a_reflex_process_killed_between_its_journal_row_and_its_line_leaves_nothing_stopped(tmp_path: Path) -> None:
    """Its journal row written and its job stopped, but its line never sent: the daemon takes
    the row in from the journal when the process is gone, and the decision continues the job."""
    import os
    import signal

    from arbiter.store import PausedEntry, PausedJournal

    with running(tmp_path, 0.2, 13, reflex_process=True) as (node, daemon, _events, pid):
        job_id = node.known_job("j")["id"]
        assert daemon.fast.linked is not None and daemon.fast.linked.link.pid is not None
        journal = PausedJournal(daemon.journal.path)  # as the reflex process does: the row, then the signal
        journal.append("pause", PausedEntry(job_id, "tree", pid, psutil.Process(pid).create_time(), "signal"))
        journal.close()
        os.kill(pid, signal.SIGSTOP)
        os.kill(daemon.fast.linked.link.pid, signal.SIGKILL)
        continued(pid)
        node.wait_for(lambda: not daemon.actuator.paused, timeout=5)


def test_a_phase_the_reflex_process_read_and_never_told_is_taken_when_it_goes(tmp_path: Path) -> None:
    """The daemon's own watcher's report of a source the process watches is set aside, not
    lost: when the process is given up, that phase is acted on at once (a tick is seconds
    away)."""
    import os
    import signal

    with running(tmp_path, 5.0, 14, reflex_process=True) as (node, daemon, events, pid):
        assert daemon.fast.linked is not None and daemon.fast.linked.link.pid is not None
        os.kill(daemon.fast.linked.link.pid, signal.SIGSTOP)  # it reads nothing more, and tells nothing
        phase(events, "on")
        node.wait_for(lambda: ("p", 0) in daemon.fast.linked.set_aside, timeout=5)
        assert not stopped(pid)
        os.kill(daemon.fast.linked.link.pid, signal.SIGKILL)
        stopped_within(pid)
        node.wait_for(lambda: node.known_job("j")["state"] == "paused", timeout=3)
