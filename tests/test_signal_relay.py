"""Signal handlers that hand their work to a thread: a signal landing at any moment, even
while the main thread is inside the very Event the callback sets, never hangs a process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from arbiter_testing.signals import signal_thread


@contextlib.contextmanager
def script(source: str) -> Iterator[subprocess.Popen[str]]:
    """``source`` run by Python in a process of its own, its output read as text; killed if
    it still runs at the end."""
    child = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()


WAITER = """
import signal, sys, threading
from arbiter.cli.signal_relay import relay_signals
stop = threading.Event()
seen = []
relay_signals({signal.SIGUSR2: lambda: seen.append(1), signal.SIGTERM: stop.set})
print("ready", flush=True)
while not stop.wait(0.0002):
    pass
print("stopped after", len(seen), "nudges", flush=True)
"""


def test_a_process_stops_on_its_signal_however_many_others_land_while_it_waits() -> None:
    with script(WAITER) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for _ in range(2000):  # a count, not a time: a loaded machine sends them as fast as it can
            os.kill(child.pid, signal.SIGUSR2)
            time.sleep(0.0001)  # spaced out, to land at every moment of its waits
        os.kill(child.pid, signal.SIGTERM)
        out, _ = child.communicate(timeout=30)
        assert child.returncode == 0 and out.startswith("stopped after"), out
        assert int(out.split()[2]) > 0


TAKEN_BY_ANOTHER_THREAD = """
import signal, threading, time
from arbiter.cli.signal_relay import relay_signals
stop = threading.Event()
tid = []
def worker():
    tid.append(threading.get_native_id())
    while not stop.is_set():
        time.sleep(0.01)
threading.Thread(target=worker, daemon=True).start()
relay_signals({signal.SIGTERM: stop.set})
while not tid:
    time.sleep(0.01)
print(tid[0], flush=True)
stop.wait()
print("stopped", flush=True)
"""


def test_a_stop_taken_by_another_thread_still_stops_a_main_thread_waiting_without_timeout() -> None:
    with script(TAKEN_BY_ANOTHER_THREAD) as child:
        assert child.stdout is not None
        worker = int(child.stdout.readline())
        signal_thread(child.pid, worker, signal.SIGTERM)
        out, _ = child.communicate(timeout=30)
        assert child.returncode == 0 and out.strip() == "stopped", out


AFTER_A_FAILED_CALLBACK = """
import os, signal, threading
from arbiter.cli.signal_relay import relay_signals
stop = threading.Event()
failed = threading.Event()
def fail():
    failed.set()
    raise OSError("the terminal is gone")
relay_signals({signal.SIGUSR1: fail, signal.SIGTERM: stop.set})
os.kill(os.getpid(), signal.SIGUSR1)
failed.wait()
print("ready", flush=True)
stop.wait()
print("stopped", flush=True)
"""


def test_a_callback_that_fails_leaves_the_relay_carrying_later_signals() -> None:
    with script(AFTER_A_FAILED_CALLBACK) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGTERM)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0 and out.strip() == "stopped", out + err
        assert "handling signal" in err and "the terminal is gone" in err
