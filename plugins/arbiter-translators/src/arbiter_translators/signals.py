"""``signal``: pause, resume and end process trees with POSIX signals."""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from typing import Literal

from arbiter.plugin import JobTarget, KindOptions, PluginContext, PluginError, ProcessRef, Translator

from arbiter_translators.identity import Signaller


class SignalOptions(KindOptions):
    kind: Literal["signal"] = "signal"


class SignalTranslator(Translator):
    """SIGSTOP/SIGCONT to pause and resume, SIGTERM/SIGKILL to end; start times checked.

    A process that exited, or whose pid now belongs to another process, is skipped
    silently: there is nothing of the job left to act on.  A process this account may not
    signal is an error, raised after every other process was handled.
    """

    Options = SignalOptions
    actions = frozenset({"pause", "resume", "terminate", "kill"})

    def __init__(self, options: SignalOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._signaller = Signaller()

    def available(self) -> tuple[bool, str]:
        if not hasattr(signal, "SIGSTOP"):
            return False, "this platform has no SIGSTOP/SIGCONT, so process trees cannot be paused with signals"
        return True, ""

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        # Root first: a stopped parent starts no new children while the rest are stopped.
        return self._send_all(target.processes, signal.SIGSTOP, "pause", target.name)

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        self._send_all(refs, signal.SIGCONT, "resume", None)

    def terminate(self, target: JobTarget) -> None:
        ended = self._send_all(target.processes, signal.SIGTERM, "terminate", target.name)
        # A stopped process keeps SIGTERM pending until it runs again: continue it so a
        # paused job can act on the request and exit.
        self._send_all(ended, signal.SIGCONT, "terminate", target.name)

    def kill(self, target: JobTarget) -> None:
        self._send_all(target.processes, signal.SIGKILL, "kill", target.name)

    def _send_all(self, refs: Iterable[ProcessRef], sig: int, action: str, job: str | None) -> list[ProcessRef]:
        sent: list[ProcessRef] = []
        refused: list[str] = []
        denied = False
        for ref in refs:
            try:
                if self._signaller.send(ref, sig):
                    sent.append(ref)
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
