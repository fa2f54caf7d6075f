"""Runs of plugin calls handed to one pool thread together, each call still under its timeout.

A tick calls a dozen plugins one after another, each call depending on what the one before
returned (the process table, then the matchers over it, then the readers over what they
chose...).  Handing each call to a pool thread and waiting for its answer woke two threads a
call; on a quiet node those wake-ups were most of what the daemon cost.  So the tick is
written as a generator of :class:`Step`: it yields each plugin call and is sent what the call
returned (or has the call's :class:`PluginFailed` thrown in, where it raised or hung), and
:func:`run_steps` runs the whole generator on one pool thread, the shell's code between the
calls included.

The calls go to a :class:`Pool` whose idle threads each wait on a bell of their own
(:mod:`arbiter.runtime.bell`), so a hand-over wakes the one thread it gives work to (the
standard pool's threads share one queue, and each hand-over woke a second idle thread too, to
find nothing there); the caller waits on its own bell, which the pool thread rings as it goes
idle.

The caller waits, and times the step that runs: a step past its limit is left behind on its
pool thread (a hung call cannot be stopped), its label is marked hung, and the caller goes on
with the rest of the generator itself, one :meth:`~arbiter.pluginmanager.PluginHost.call` a
step, as it would have without a run (:func:`drive`).  The pool thread, once the hung call
returns, sees that it was given up and leaves the generator alone.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from arbiter.runtime.bell import Bell
from arbiter.runtime.childwork import CHILD_CPU

T = TypeVar("T")


class PluginFailed(Exception):
    """A plugin call raised or ran past its timeout."""

    def __init__(self, label: str, why: str) -> None:
        self.label = label
        self.why = why
        super().__init__(f"{label}: {why}")


@dataclass(frozen=True)
class Step:
    """One plugin call of a run: ``fn(*args)`` under ``timeout`` (None: the host's)."""

    label: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    timeout: float | None = None


#: a run of steps returning T: yields each :class:`Step`, is sent what it returned
Steps = Generator[Step, Any, T]
#: ``PluginHost.call``: (label, fn, *args) under a timeout, raising PluginFailed
Call = Callable[..., Any]


class _Worker:
    """One pool thread; ``go`` rings when it has work, or is to end (``job`` None)."""

    def __init__(self) -> None:
        self.go = Bell()
        self.job: tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None = None


class Pool:
    """Threads for plugin calls: :meth:`submit` gives a call to the thread that went idle
    last (its caches warm), waking it alone, or starts one while fewer than ``workers`` run;
    past that a call waits for the first thread free.  The threads are daemon threads: one
    left behind by a call that hangs never holds the process's exit."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._waiting: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._started = 0
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the plugin pool is closed")
            if self._idle:
                worker: _Worker | None = self._idle.pop()
            elif self._started < self._workers:
                worker = _Worker()
                self._started += 1
                threading.Thread(
                    target=self._serve, args=(worker,), name=f"{self._name}_{self._started - 1}", daemon=True
                ).start()
            else:
                worker = None
                self._waiting.append((future, fn, args))
        if worker is not None:
            worker.job = (future, fn, args)
            worker.go.ring()
        return future

    def _serve(self, worker: _Worker) -> None:
        while True:
            worker.go.wait()
            job, worker.job = worker.job, None
            while job is not None:
                tell = _made(job)
                job = None
                with self._lock:
                    if self._waiting:
                        job = self._waiting.popleft()
                    elif not self._closed:
                        self._idle.append(worker)
                # the caller is told last, as this thread goes idle: woken, it finds the
                # interpreter free instead of waiting for this thread to let it go
                tell()
                del tell  # nothing of the call outlives it here
            if self._closed:
                return

    def close(self) -> None:
        """Cancel the calls still waiting and let the idle threads end; a call running ends
        on its own."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            idle, self._idle = self._idle, []
        for future, _, _ in waiting:
            future.cancel()
        for worker in idle:
            worker.go.ring()


def _made(job: tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]) -> Callable[[], None]:
    """Make the call of ``job`` (unless it was cancelled); what tells its future the outcome."""
    future, fn, args = job
    if not future.set_running_or_notify_cancel():
        return lambda: None
    try:
        value = fn(*args)
    except BaseException as exc:  # the caller meets it through the future
        return partial(future.set_exception, exc)
    return partial(future.set_result, value)


def counting_children(spent: list[float], fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, adding to ``spent[0]`` the CPU seconds its child workers report."""
    token = CHILD_CPU.set(spent)
    try:
        return fn(*args)
    finally:
        CHILD_CPU.reset(token)


def one(label: str, fn: Callable[..., T], *args: Any) -> Steps[T]:
    """A single call as a run of one step (``x = yield from one(...)``): raises PluginFailed."""
    result: T = yield Step(label, fn, args)
    return result


def each(calls: Sequence[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> Steps[list[Any]]:
    """Every ``(label, fn, args)``: what each returned, or the PluginFailed it met."""
    out: list[Any] = []
    for label, fn, args in calls:
        try:
            out.append((yield Step(label, fn, args)))
        except PluginFailed as exc:
            out.append(exc)
    return out


def drive(steps: Steps[T], call: Call, failed: PluginFailed | None = None) -> T:
    """Run ``steps`` on the calling thread, each step through ``call``; ``failed``: thrown
    into the generator first (the step a run gave up on)."""
    result: Any = None
    while True:
        try:
            step = steps.throw(failed) if failed is not None else steps.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        result, failed = None, None
        try:
            if step.timeout is None:
                result = call(step.label, step.fn, *step.args)
            else:
                result = call(step.label, step.fn, *step.args, timeout=step.timeout)
        except PluginFailed as exc:
            failed = exc


@dataclass
class _Progress:
    """A run's progress on its pool thread; read and written under its lock."""

    step: Step | None = None  # the call running now (None: the shell's code between calls)
    since: float = 0.0
    started: bool = False  # whether a pool thread took the run up
    abandoned: bool = False
    cpu: float = 0.0  # CPU seconds the pool thread and its child workers spent on the run
    done: bool = False
    value: Any = None
    error: BaseException | None = None


def run_steps(
    submit: Callable[[Callable[[], None]], Future[None]],
    steps: Steps[T],
    *,
    timeout_s: float,
    refuse: Callable[[str], None],
    hung: Callable[[str, Future[None], float], None],
    call: Call,
    bell: Bell | None = None,
) -> tuple[T, float]:
    """Run ``steps`` on one pool thread (``submit``); (what it returned, the CPU seconds it
    spent there).  ``refuse(label)`` raises PluginFailed while that label's earlier call
    still hangs; ``hung(label, future, limit)`` marks a step given up; ``call`` runs the steps
    after one that hung, on this thread; ``bell``: the calling thread's own (see
    :mod:`arbiter.runtime.bell`), one made for this run if None."""
    bell = bell or Bell()
    turn = threading.Lock()
    run = _Progress()

    def work() -> None:
        mark = time.thread_time()  # the pool thread's CPU clock when last counted
        value: Any = None
        failed: PluginFailed | None = None
        while True:
            with turn:
                if run.abandoned:
                    return
                run.started = True
                try:
                    step = steps.throw(failed) if failed is not None else steps.send(value)
                except StopIteration as stop:
                    run.done, run.value = True, stop.value
                    return
                except BaseException as exc:  # the shell's own code failed: the caller raises it
                    run.done, run.error = True, exc
                    return
                finally:
                    now = time.thread_time()
                    run.cpu, mark = run.cpu + now - mark, now
                value, failed = None, None
                try:
                    refuse(step.label)
                except PluginFailed as exc:
                    failed = exc
                    continue
                run.step, run.since = step, time.monotonic()
            if step.timeout is not None:
                bell.ring()  # the caller looks at a limit of this step's own, not the host's
            children = [0.0]
            try:
                value = counting_children(children, step.fn, *step.args)
            except Exception as exc:  # any plugin exception is isolated here
                failed = PluginFailed(step.label, f"{type(exc).__name__}: {exc}")
                failed.__cause__ = exc
            with turn:
                now = time.thread_time()
                run.step = None
                run.cpu, mark = run.cpu + now - mark + children[0], now

    # the pool thread rings as it goes idle, and the wait for it is the first thing after the
    # hand-over (no look under the lock the pool thread takes now: no step has begun)
    step: Step | None = None
    limit = timeout_s
    deadline = time.monotonic() + limit
    future = submit(work)
    future.add_done_callback(lambda _: bell.ring())
    while not future.done():
        rung = bell.wait(max(0.0, deadline - time.monotonic()))
        if future.done() or (not rung and time.monotonic() < deadline):
            continue
        with turn:
            if not run.started:
                if time.monotonic() < deadline:
                    continue  # a ring an earlier run left
                # every pool thread is taken (by calls that hang): the run is taken back
                # and its calls made from here, each failing on its own timeout
                run.abandoned = True
                future.cancel()
                return drive(steps, call), run.cpu
            if run.step is None or run.step is not step or time.monotonic() - run.since < limit:
                # another step runs now, or this one is still within its limit
                step, since = run.step, run.since
                limit = timeout_s if step is None or step.timeout is None else step.timeout
                deadline = time.monotonic() + limit if step is None else since + limit
                continue
            run.abandoned = True
            cpu = run.cpu
            assert step is not None
            hung(step.label, future, limit)
            value = drive(steps, call, PluginFailed(step.label, f"no answer within {limit:g}s"))
            return value, cpu
    if run.error is not None:
        raise run.error
    if not run.done:
        future.result()  # the step raised past Exception (KeyboardInterrupt...), or close cancelled the run
    return run.value, run.cpu
