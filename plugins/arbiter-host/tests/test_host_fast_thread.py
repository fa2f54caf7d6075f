"""``arbiter_fast_thread``: a 0.1 ms scheduler slice for the calling thread only, its policy
and nice value kept, where the kernel keeps a slice per thread; a reason where it does not."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from arbiter_host import arbiter_fast_thread
from arbiter_host.fastthread import SLICE_NS, SchedAttr, SchedCalls, ask_short_slice

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sched_setattr is Linux's")


def on_a_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(10)
    return out[0]


def slices_per_thread() -> bool:
    """Whether this kernel keeps a fair thread's slice (Linux 6.12+ reports it back)."""
    runtime_ns: int = on_a_thread(lambda: SchedCalls().get().runtime_ns)
    return runtime_ns > 0


@linux
def test_only_the_calling_thread_gets_the_short_slice_and_keeps_its_nice_value() -> None:
    if not slices_per_thread():
        pytest.skip("this kernel keeps no slice per thread")

    def niced_then_hinted() -> tuple[str | None, SchedAttr]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 7)  # a thread's own nice value, on Linux
        return arbiter_fast_thread(role="decide"), SchedCalls().get()

    before = SchedCalls().get()
    said, after = on_a_thread(niced_then_hinted)
    assert after.runtime_ns == SLICE_NS
    assert after.nice == 7 and after.policy == before.policy
    assert said is not None and "slice 0.1 ms" in said and "nice 7" in said
    assert SchedCalls().get() == before  # this thread, and so the process's others, untouched


@linux
def test_a_thread_under_a_policy_that_is_not_fair_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SchedCalls, "get", lambda self: SchedAttr(1, 0, 0, 10, 0))  # SCHED_FIFO
    monkeypatch.setattr(SchedCalls, "set", lambda self, attr: pytest.fail("a real-time thread was changed"))
    said = ask_short_slice()
    assert said is not None and "policy 1" in said


@linux
def test_a_kernel_that_keeps_no_slice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SchedCalls, "get", lambda self: SchedAttr(0, 0, 0, 0, 0))  # before 6.12: runtime read back 0
    monkeypatch.setattr(SchedCalls, "set", lambda self, attr: None)
    said = ask_short_slice()
    assert said is not None and "keeps no slice per thread" in said


@linux
def test_a_refused_call_is_a_reason_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: SchedCalls, attr: SchedAttr) -> None:
        raise OSError(1, "sched_setattr: Operation not permitted")

    monkeypatch.setattr(SchedCalls, "set", refuse)
    said = on_a_thread(ask_short_slice)
    assert said == "no scheduler hint: sched_setattr: Operation not permitted"


def test_off_linux_it_has_nothing_to_say(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert ask_short_slice() is None


@linux
def test_a_machine_without_the_call_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SchedCalls, "available", property(lambda self: False))
    said = ask_short_slice()
    assert said is not None and said.startswith("no scheduler hint: this libc has no sched_setattr")
