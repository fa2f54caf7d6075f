"""``signal``: pause, resume and end process trees with POSIX signals."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable, Sequence
from typing import Literal

from arbiter.plugin import JobTarget, KindOptions, PluginContext, PluginError, ProcessRef, Translator
from arbiter_translators.identity import REUSED, SENT, Signaller

#: how often :meth:`SignalTranslator.settle` looks whether its processes have stopped
SETTLE_POLL_S = 0.00005
#: what stopping a job's processes frees, and what it does not
PLAIN_PAUSE = (
    "its processes are stopped: GPU work it had already queued runs to completion, then it submits none; "
    "the VRAM it holds stays allocated (the cuda_checkpoint translator frees it)"
)


class SignalOptions(KindOptions):
    kind: Literal["signal"] = "signal"


class SignalTranslator(Translator):
    """SIGSTOP/SIGCONT to pause and resume, SIGTERM/SIGKILL to end; start times checked.

    A process that exited is skipped silently: there is nothing of the job left to act on.
    One whose pid now belongs to another process is skipped too, and reported through the
    context's ``pid_reused`` (the timeline says why nothing was sent).  A process this
    account may not signal is an error, raised after every other process was handled.
    """

    Options = SignalOptions
    actions = frozenset({"pause", "resume", "terminate", "kill"})
    bounded = True  # signals and reads of the kernel's process files: nothing waits
    rank = 20  # signals work on every POSIX host

    def __init__(self, options: SignalOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._signaller = Signaller()

    def available(self) -> tuple[bool, str]:
        if not hasattr(signal, "SIGSTOP"):
            return False, "this platform has no SIGSTOP/SIGCONT, so process trees cannot be paused with signals"
        return True, ""

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        # Root first: a stopped parent starts no new children while the rest are stopped.
        return self._send_all(target.processes, signal.SIGSTOP, "pause", target.name, target.job_id)

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        self._send_all(refs, signal.SIGCONT, "resume", None)

    def pause_effect(self, refs: Sequence[ProcessRef]) -> str:
        return PLAIN_PAUSE

    def settle(self, refs: Sequence[ProcessRef], timeout_s: float) -> bool:
        # A stopped process must run once to stop: the kernel stops it on its way back to
        # user space.  Sleeping between reads leaves it this thread's core, from the first:
        # just signalled, it has not run yet, and this core may be the one it runs on.
        deadline = time.monotonic() + timeout_s
        waiting, untold = list(refs), False
        if timeout_s > 0:
            time.sleep(SETTLE_POLL_S)
        while True:
            seen = [(r, self._signaller.stopped(r)) for r in waiting]
            untold = untold or any(stopped is None for _, stopped in seen)  # not waited for
            waiting = [r for r, stopped in seen if stopped is False]
            if not waiting:
                return not untold
            if time.monotonic() >= deadline:
                return False
            time.sleep(SETTLE_POLL_S)

    def terminate(self, target: JobTarget) -> None:
        ended = self._send_all(target.processes, signal.SIGTERM, "terminate", target.name, target.job_id)
        # A stopped process keeps SIGTERM pending until it runs again: continue it so a
        # paused job can act on the request and exit.
        self._send_all(ended, signal.SIGCONT, "terminate", target.name, target.job_id)

    def kill(self, target: JobTarget) -> None:
        self._send_all(target.processes, signal.SIGKILL, "kill", target.name, target.job_id)

    def _send_all(
        self, refs: Iterable[ProcessRef], sig: int, action: str, job: str | None, job_id: str = ""
    ) -> list[ProcessRef]:
        sent: list[ProcessRef] = []
        refused: list[str] = []
        denied = False
        for ref in refs:
            try:
                outcome, start = self._signaller.deliver(ref, sig)
                if outcome == SENT:
                    sent.append(ref)
                elif outcome == REUSED and start is not None:
                    self._reused(job_id, ref, start, action)
            except PermissionError:
                denied = True
                refused.append(f"pid {ref.pid}: not permitted")
            except ValueError as exc:
                refused.append(str(exc))
            except OSError as exc:
                refused.append(f"pid {ref.pid}: {exc.strerror or exc}")
        if refused:
            what = f"job {job!r}" if job else "these processes"
            hint = (
                " To signal another user's processes, run the daemon as that user, as root, or with CAP_KILL."
                if denied
                else ""
            )
            raise PluginError(
                f"could not {action} {what}: {'; '.join(refused)} "
                f"(the other {len(sent)} process(es) were signalled).{hint}"
            )
        return sent

    def _reused(self, job_id: str, ref: ProcessRef, start: float, action: str) -> None:
        report = self.context.pid_reused
        if report is None:
            return
        why = (
            f"did not {action} pid {ref.pid}: it now belongs to a process started at {start:.2f}, not the one "
            f"recorded at {ref.start_time:.2f} (the pid was reused); no signal was sent"
        )
        try:
            report(job_id, ref, why)
        except Exception:  # reporting must never stop the other processes being handled
            pass
