"""The reflex process acts beside the decision: a phase change pauses work while a decision
is still being made, and that decision, made on the phase before, is made again rather than
undo it.  Without the process, the decision thread acts on a phase change at once, between
ticks, and takes every report in the order it came."""

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

import arbiter.daemon.core as core
import arbiter.daemon.decider as decider
from arbiter.config.loader import load_node_config
from arbiter.daemon.core import Daemon
from arbiter.engine.decide import decide as engine_decide
from arbiter.plugin import SourceState
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": value}) + "\n")


def verdict(daemon: Daemon, node: HarnessNode, name: str) -> str | None:
    """The last decision's state for the job ``name``."""
    decision = daemon.parts.snapshot.decision
    return decision.jobs[node.known_job(name)["id"]].state if decision is not None else None


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def stopped_within(pid: int, timeout: float = 10.0) -> float:
    """Wait until the job ``pid`` is stopped; how long it took."""
    started = time.monotonic()
    wait_until(lambda: stopped(pid), timeout, f"pid {pid} to be stopped", poll_s=0.002)
    return time.monotonic() - started


def continued(pid: int, timeout: float = 10.0) -> None:
    wait_until(lambda: not stopped(pid), timeout, f"pid {pid} to be continued", poll_s=0.002)


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
        {
            "id": "p",
            "match": {"cmdline": [f"sleep {1000 + n}"]},
            "immediate": True,
            "during": [
                {
                    "source": {"kind": "jsonl", "path": str(events), "event": "status", "field": "phase", "on": ["on"]},
                    "pause_fleet": {"scope": "all"},
                }
            ],
        },
    )
    config, _ = load_node_config(node.config_path)
    daemon = Daemon(config, node.config_path)
    daemon.start()
    try:
        node.spawn(["sleep", str(1000 + n)])
        node.job_run(["sleep", str(3000 + n)], "--name", "j")
        pid = node.wait_for(lambda: ((node.job("j") or {}).get("pids") or [None])[0], timeout=30)
        daemon.ticker.reload()  # a tick now: the protected program is seen
        node.wait_for(
            lambda: daemon.parts.snapshot.obs is not None and daemon.parts.snapshot.obs.rules["p"].running, timeout=30
        )
        if reflex_process:  # the process watches the phase, and a decision has armed it
            node.wait_for(lambda: daemon.api.status()["fast_path"]["reflex_process"]["sources"] == 1, timeout=30)
            daemon.parts.jobs_changed()
            # an arm for the source is sent under the signalling lock, which the process waits
            # for before it acts: once sent, the process acts on it (or on a later one)
            link = daemon.intake.linked.link if daemon.intake.linked else None
            assert link is not None
            wait_until(lambda: link._arm, 30, "a decision to arm the reflex process for the source")
        yield node, daemon, events, pid
    finally:
        daemon.shutdown()
        node.close()


def test_a_phase_pauses_while_a_decision_is_made_and_that_decision_never_undoes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long tick: the decisions here are the test's
    with running(tmp_path, 5, 3, reflex_process=True) as (node, daemon, events, pid):
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
        daemon.parts.jobs_changed()
        assert entered.wait(10)

        phase(events, "on")
        # the decision is held for 10 s: a reflex that waited for it would take that long
        took = stopped_within(pid, timeout=5)
        print(f"\nphase on -> job stopped, a decision held meanwhile: {1000 * took:.1f} ms")

        redecisions, decisions = daemon.parts.costs()["redecisions"], daemon.parts.costs()["decisions"]
        held.set()  # the held decision said "run": carried out, it would continue the job
        node.wait_for(lambda: daemon.parts.costs()["redecisions"] > redecisions, timeout=10)
        node.wait_for(lambda: verdict(daemon, node, "j") == "paused", timeout=10)
        # the batch the held decision was made in is done: what it would have done, it has
        wait_until(lambda: daemon.parts.costs()["decisions"] > decisions, 10, "the held decision's batch to end")
        assert stopped(pid) and resumes == []  # never continued, not even for a moment

        phase(events, "off")
        continued(pid)
        # the reflex process continued it, and the daemon's record says so
        node.wait_for(lambda: daemon.api.status()["fast_path"]["reflex_process"]["armed"] >= 2, timeout=5)
        node.wait_for(lambda: not daemon.actuator.paused, timeout=5)


def test_a_decision_that_may_not_be_made_again_holds_the_reflex_process_off_and_is_carried_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``REDECIDE_AT_MOST`` tries (here at once) a decision is made under the lock the
    reflex process signals under, the process waiting for it: a source flapping faster than
    decisions never starves them."""
    monkeypatch.setattr(decider, "REDECIDE_AT_MOST", 0)
    with running(tmp_path, 0.2, 4, reflex_process=True) as (_node, daemon, events, pid):
        phase(events, "on")
        stopped_within(pid)
        phase(events, "off")
        continued(pid)
        assert daemon.parts.costs()["redecisions"] == 0


def test_each_decision_makes_every_jobs_target_so_the_next_finds_them_made(tmp_path: Path) -> None:
    # with fifty jobs, making their targets (and paused entries) on a phase change came before the first signal
    with running(tmp_path, 5, 5) as (node, daemon, events, pid):

        def made_for_this_view() -> tuple[Any, dict[Any, Any]] | None:
            # read together: the daemon's next decision replaces the targets and what it prepared
            view, made = daemon.targets._made
            prepared = daemon.actuator._prepared
            if view is not daemon.parts.snapshot.view or not {r.id for r in daemon.jobs.active()} <= {
                k[0] for k in made
            }:
                return None
            if not all(prepared.get(id(t), (None,))[0] is t for t in made.values()):
                return None
            return view, dict(made)

        view, before = node.wait_for(made_for_this_view)
        phase(events, "on")
        stopped_within(pid)
        if daemon.targets._made[0] is view:  # no tick came between: the phase's decision made nothing new
            assert daemon.targets._made[1].keys() == before.keys()
            assert all(daemon.targets._made[1][key] is target for key, target in before.items())


def test_without_the_reflex_process_the_decision_thread_acts_on_a_phase_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a tick a minute away: only the decision the report brings about can pause the job
    with running(tmp_path, 60, 6) as (_node, daemon, events, pid):
        pausing: list[str] = []
        real = daemon.actuator.pause_trees

        def pause_trees(targets: Any) -> Any:
            if targets:  # every decision's act calls it, most with nothing to pause
                pausing.append(threading.current_thread().name)
            return real(targets)

        monkeypatch.setattr(daemon.actuator, "pause_trees", pause_trees)
        phase(events, "on")
        stopped_within(pid, timeout=30)
        # the admission's change wakes the tick, whose decision may follow at once and pause
        # the tree again (it catches children born since): each on the decision thread
        assert pausing and set(pausing) == {"decide"}, pausing
        phase(events, "off")
        continued(pid, timeout=30)


def test_reports_are_taken_in_the_order_they_came(tmp_path: Path) -> None:
    """A burst of phase lines, the last one "off": the job ends running, whatever batches the
    decision thread took them in."""
    with running(tmp_path, 60, 7) as (node, daemon, events, pid):
        phase(events, "on")
        stopped_within(pid, timeout=30)
        for _ in range(20):
            phase(events, "on")
            phase(events, "off")
        continued(pid, timeout=30)
        node.wait_for(lambda: verdict(daemon, node, "j") == "run", timeout=30)
        assert not stopped(pid) and not daemon.actuator.paused


def test_every_report_in_one_batch_is_taken_after_one_that_makes_the_decision_urgent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "on" then "off" reach the decision thread in one batch (it is held meanwhile): the
    first makes a decision urgent, and the second must still reach the source book."""
    with running(tmp_path, 60, 10) as (node, daemon, _events, pid):
        real = engine_decide
        held, entered = threading.Event(), threading.Event()
        first = [True]

        def slow_decide(*args: Any) -> Any:
            if first[0]:
                first[0] = False
                entered.set()
                held.wait(10)
            return real(*args)

        monkeypatch.setattr(decider, "decide", slow_decide)
        daemon.parts.jobs_changed()
        assert entered.wait(10)
        now = time.monotonic()
        daemon.intake.on_source("p", 0, SourceState(readable=True, phase="on", changed_at=now))
        daemon.intake.on_source("p", 0, SourceState(readable=True, phase="off", changed_at=now + 0.001))
        held.set()
        node.wait_for(lambda: (daemon.intake.book.state(("p", 0)) or SourceState()).phase == "off", timeout=10)
        node.wait_for(lambda: verdict(daemon, node, "j") == "run", timeout=10)
        assert not stopped(pid)


def test_a_report_that_comes_once_the_daemon_is_stopping_pauses_nothing(tmp_path: Path) -> None:
    # the shutdown resumes what is paused: a pause after that would be left in place
    with running(tmp_path, 5, 8) as (_node, daemon, _events, pid):
        daemon.request_stop()
        daemon.intake.on_source("p", 0, SourceState(readable=True, phase="on", changed_at=time.monotonic()))
        # queued, if anywhere, for the decision thread: once it has ended, nothing is left
        # to act on the report before the shutdown
        wait_until(lambda: not any(t.is_alive() for t in daemon._threads), 10, "the daemon's threads to end")
        assert not stopped(pid) and not daemon.actuator.paused


def test_the_shutdown_resumes_what_a_decision_still_acting_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shutdown's wait for the decision thread runs out while its act pauses a job (a
    slow translator): the resume waits for that act, so the job does not stay stopped."""
    monkeypatch.setattr(core, "JOIN_WAIT_S", 0.2)
    with running(tmp_path, 60, 11) as (_node, daemon, events, pid):
        entered, release = threading.Event(), threading.Event()
        real = daemon.actuator.pause_trees

        def pause_trees(targets: Any) -> Any:
            if targets:
                entered.set()
                release.wait(10)
            return real(targets)

        monkeypatch.setattr(daemon.actuator, "pause_trees", pause_trees)
        phase(events, "on")
        assert entered.wait(10)
        threading.Timer(1.0, release.set).start()  # after the shutdown gave up on the thread
        daemon.shutdown()
        assert not stopped(pid) and not daemon.actuator.paused


def test_a_reflex_process_killed_between_its_journal_row_and_its_line_leaves_nothing_stopped(tmp_path: Path) -> None:
    """Its journal row written and its job stopped, but its line never sent: the daemon takes
    the row in from the journal when the process is gone, and the decision continues the job."""
    import os
    import signal

    from arbiter.state.journal import PausedEntry, PausedJournal

    with running(tmp_path, 0.2, 13, reflex_process=True) as (node, daemon, _events, pid):
        job_id = node.known_job("j")["id"]
        assert daemon.intake.linked is not None and daemon.intake.linked.link.pid is not None
        journal = PausedJournal(daemon.journal.path)  # as the reflex process does: the row, then the signal
        journal.append("pause", PausedEntry(job_id, "tree", pid, psutil.Process(pid).create_time(), "signal"))
        journal.close()
        os.kill(pid, signal.SIGSTOP)
        os.kill(daemon.intake.linked.link.pid, signal.SIGKILL)
        continued(pid)
        node.wait_for(lambda: not daemon.actuator.paused, timeout=5)


def test_a_phase_the_reflex_process_read_and_never_told_is_taken_when_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's own watcher's report of a source the process watches is set aside, not
    lost: when the process is given up, that phase is acted on at once.  Ticks are a minute
    apart, so no tick's own reading (taken after two quiet ticks, as from a process that
    stalled) can act on the phase first, however slow the machine is.  While the process
    reads the source, the daemon's watcher reads it on its safety check only: a second here."""
    import os
    import signal

    from arbiter_sources import follow

    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 1.0)
    with running(tmp_path, 60, 14, reflex_process=True) as (node, daemon, events, pid):
        assert daemon.intake.linked is not None and daemon.intake.linked.link.pid is not None
        os.kill(daemon.intake.linked.link.pid, signal.SIGSTOP)  # it reads nothing more, and tells nothing
        stopped_within(daemon.intake.linked.link.pid)  # the signal lands a moment after kill() returns
        phase(events, "on")
        node.wait_for(lambda: ("p", 0) in daemon.intake.linked.set_aside, timeout=5)
        assert not stopped(pid)
        os.kill(daemon.intake.linked.link.pid, signal.SIGKILL)
        stopped_within(pid)
        node.wait_for(lambda: node.known_job("j")["state"] == "paused", timeout=3)


def test_the_daemons_own_watcher_rests_while_the_reflex_process_reads_and_reads_at_once_when_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phase line wakes one reader: while the process watches the source, the daemon's own
    watcher of it reads only on its safety check (an hour apart here), so none of its reports
    is set aside; once the process is gone, that watcher reads at once and the decision acts
    on the phase the process never told."""
    import os
    import signal

    from arbiter_sources import follow

    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    with running(tmp_path, 60, 15, reflex_process=True) as (node, daemon, events, pid):
        linked = daemon.intake.linked
        assert linked is not None and linked.link.pid is not None
        phase(events, "on")
        stopped_within(pid)
        node.wait_for(lambda: node.known_job("j")["state"] == "paused", timeout=5)  # its line taken
        phase(events, "off")
        continued(pid)
        node.wait_for(lambda: node.known_job("j")["state"] != "paused", timeout=5)
        assert ("p", 0) not in linked.set_aside
        os.kill(linked.link.pid, signal.SIGSTOP)  # it reads nothing more, and tells nothing
        stopped_within(linked.link.pid)
        phase(events, "on")
        os.kill(linked.link.pid, signal.SIGKILL)
        stopped_within(pid)
        node.wait_for(lambda: node.known_job("j")["state"] == "paused", timeout=5)
