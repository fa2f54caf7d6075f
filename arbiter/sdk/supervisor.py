"""Running a third-party workload under a job's control document (standard library only).

A workload (a server, a renderer) cannot take ``with duty.unit():``; its supervisor runs it,
calls ``gpu_duty(d)`` on every duty change so the job can turn the duty into the workload's
own knobs, pauses its process group while the control document says ``paused``, and on
``stop`` ends it: SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from .control import Control

_WAIT_SLICE_S = 0.25


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> bool:
    """Signal the process group ``proc`` leads (started with ``start_new_session``), only
    while that group id can still be the one it led; whether a signal was sent.

    Until ``proc`` is reaped its pid, and so the group id, is held.  Once reaped, the number
    stays held only while the group has members (the kernel does not hand out a pid still
    used as a group id): a process that has the number now means the group left none, and
    the group of that id is the newcomer's.
    """
    if proc.returncode is not None:
        try:
            os.kill(proc.pid, 0)
        except ProcessLookupError:
            pass  # nobody has the number: whatever group bears it is what the leader left
        except PermissionError:
            return False  # the number belongs to another account's process now
        else:
            return False
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


class Supervisor:
    """Runs ``cmd`` and keeps it in step with the control document.

    :param cmd: the workload's argv.
    :param gpu_duty: called with the duty at start and on every change.
    :param ctl: the job's :class:`Control` (default: one from the environment).
    :param stop_grace_s: how long SIGTERM has before SIGKILL.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        gpu_duty: Callable[[float], None] | None = None,
        ctl: Control | None = None,
        stop_grace_s: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.on_duty = gpu_duty
        self.ctl = ctl if ctl is not None else Control()
        self.stop_grace_s = stop_grace_s
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.duty: float | None = None

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        signal_group(self.proc, sig)  # the workload's whole group: its children too

    def _apply(self) -> bool:
        """Bring the workload in step with the document; False once it was told to stop."""
        if self.ctl.state == "stop":
            return False
        if self.ctl.gpu_duty != self.duty:
            self.duty = self.ctl.gpu_duty
            if self.on_duty is not None:
                self.on_duty(self.duty)
        want_paused = self.ctl.state == "paused"
        if want_paused != self.paused:
            self._signal(signal.SIGSTOP if want_paused else signal.SIGCONT)
            self.paused = want_paused
        return True

    def run(self) -> int:
        """Run the workload until it exits (its exit code) or is stopped (0 after stop_ack)."""
        self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True)
        try:
            while self.proc.poll() is None:
                if not self._apply():
                    return self._stop()
                self.ctl.wait(_WAIT_SLICE_S)
            return self.proc.returncode
        except BaseException:
            self._stop()
            raise

    def _stop(self) -> int:
        assert self.proc is not None
        if self.paused:
            self._signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.paused = False
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        return self.ctl.acknowledge_stop()
