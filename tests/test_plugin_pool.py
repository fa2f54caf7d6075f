"""The plugin pool and the runs of steps handed to it keep what a standard pool gave: what a
step raises reaches the caller (KeyboardInterrupt too), a run the pool cancels fails rather
than answering None, a step's own limit holds, a ring left by an earlier run ends no later one
early, and neither a long timeout nor many calling threads break it."""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import CancelledError
from typing import Any

import pytest

from arbiter.pluginmanager import PluginFailed, build_plugin_manager
from arbiter.pluginsteps import Pool, Step, one, run_steps
from arbiter.runtime.bell import Bell
from arbiter_testing import wait_until


def _slept(seconds: float) -> str:
    time.sleep(seconds)
    return "ok"


def _raise(exc: BaseException) -> None:
    raise exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_a_base_exception_in_a_step_reaches_the_caller(exc: BaseException) -> None:
    host = build_plugin_manager(entry_points=False)
    try:
        with pytest.raises(type(exc)):
            host.run_steps(one("boom", _raise, exc))
    finally:
        host.close()


def test_a_base_exception_in_a_single_call_reaches_the_caller() -> None:
    host = build_plugin_manager(entry_points=False)
    try:
        with pytest.raises(KeyboardInterrupt):
            host.call("boom", _raise, KeyboardInterrupt())
    finally:
        host.close()


def test_a_run_cancelled_by_close_does_not_return_none() -> None:
    pool = Pool(1, "one")
    release = threading.Event()
    pool.submit(release.wait, 30)  # the one thread, taken
    out: list[Any] = []

    def steps() -> Any:
        yield Step("x", lambda: 1)
        return "value"

    def caller() -> None:
        try:
            out.append(
                run_steps(pool.submit, steps(), timeout_s=30, refuse=lambda _l: None, hung=lambda *_: None, call=None)  # type: ignore[arg-type]
            )
        except BaseException as exc:  # what it raised is the outcome
            out.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    wait_until(lambda: len(pool._waiting) == 1, 5, "queued")
    pool.close()
    t.join(10)
    release.set()
    assert out and isinstance(out[0], (CancelledError, PluginFailed, RuntimeError)), f"run_steps gave {out!r}"


def test_a_stale_ring_does_not_end_a_later_run_early() -> None:
    host = build_plugin_manager(entry_points=False, timeout_s=0.3)
    gate = threading.Event()
    try:
        # a run left behind on a hung step: its pool thread rings this thread's bell later
        def steps1() -> Any:
            try:
                yield Step("hang", gate.wait, (30,))
            except PluginFailed:
                return "a"

        assert host.run_steps(steps1()) == "a"
        gate.set()
        time.sleep(0.05)

        def steps2() -> Any:
            v = yield Step("slowish", time.sleep, (0.1,))
            return ("b", v)

        assert host.run_steps(steps2()) == ("b", None)
    finally:
        host.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_fd_leak_per_calling_thread() -> None:
    host = build_plugin_manager(entry_points=False)
    try:

        def round_() -> None:
            threads = [threading.Thread(target=host.run_steps, args=(one("x", lambda: 1),)) for _ in range(40)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        for _ in range(3):
            round_()  # the pool grows to its threads
        gc.collect()
        assert host._pool is not None
        before = _fds() - 2 * host._pool._started  # a pool thread's own bell: 2 fds
        for _ in range(10):
            threads = [threading.Thread(target=host.run_steps, args=(one("x", lambda: 1),)) for _ in range(40)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        after_nogc = _fds() - 2 * host._pool._started
        gc.collect()
        after = _fds() - 2 * host._pool._started
        assert after - before <= 4, (before, after_nogc, after)
    finally:
        host.close()


def test_bell_fds_are_not_inherited() -> None:
    bell = Bell()
    assert not os.get_inheritable(bell._read) and not os.get_inheritable(bell._write)


def test_a_short_step_timeout_is_kept() -> None:
    host = build_plugin_manager(entry_points=False, timeout_s=5)
    gate = threading.Event()
    try:

        def steps() -> Any:
            try:
                yield Step("short", gate.wait, (30,), timeout=0.3)
            except PluginFailed:
                return "timed out"
            return "answered"

        started = time.monotonic()
        assert host.run_steps(steps()) == "timed out"
        took = time.monotonic() - started
        assert took < 3, took
    finally:
        gate.set()
        host.close()


def test_a_long_plugin_timeout_the_config_accepts_still_runs_steps() -> None:
    host = build_plugin_manager(entry_points=False, timeout_s=3_000_000)  # plugin_timeout_s has no upper bound
    try:
        assert host.run_steps(one("slow", _slept, 0.2)) == "ok"
    finally:
        host.close()
