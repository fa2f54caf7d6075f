"""``cgroup_freeze``: pause a job by freezing its own cgroup (v2), where the daemon may.

Freezing stops every task of the group at once, children started a moment ago included,
and nothing in the job can notice or undo it (a SIGSTOP can be caught by a debugger or
undone by a SIGCONT from the job itself).  It is used only for a cgroup that holds the
job's processes and nothing else (a ``systemd-run --scope`` or a container), and only where
the daemon may write ``cgroup.freeze``; otherwise the job is paused with signals, and
again with signals, without looking, for the next ``SHARED_RECHECK_S``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from arbiter.plugin import JobTarget, PluginContext, PluginError, ProcessRef
from arbiter_translators.signals import SignalOptions, SignalTranslator

_POLL_S = 0.005
#: a job found without a cgroup of its own is paused with signals, without looking again,
#: for this long: a look reads files (for a cgroup shared with a login session, every
#: member's pid), and each read waits for the interpreter lock again; fifty of them were
#: most of a phase's fast path under load.  Signals always pause a job correctly, and a
#: freeze is only ever made on a fresh look.
SHARED_RECHECK_S = 30.0


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where the unified (v2) hierarchy is mounted, or None."""
    try:
        with open(mountinfo) as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split()[4].replace("\\040", " ")
    except OSError:
        return None
    return None


def cgroup_of(pid: int) -> str | None:
    """The v2 cgroup path of ``pid`` (``0::/a/b`` → ``/a/b``), or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


class CgroupFreezeOptions(SignalOptions):
    kind: Literal["cgroup_freeze"] = "cgroup_freeze"  # type: ignore[assignment]
    timeout_s: float = Field(1.0, gt=0, le=30, description="how long to wait for the group to report frozen")


class CgroupFreezeTranslator(SignalTranslator):
    """Freezes the job's own cgroup; falls back to signals where it cannot (see the module)."""

    Options = CgroupFreezeOptions
    bounded = True  # besides signals, cgroup files, and a wait for the freeze with its own deadline
    rank = 10  # a job's cgroup frozen whole, else signals: first where it is available

    def __init__(self, options: CgroupFreezeOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: CgroupFreezeOptions = options
        self.mount = cgroup2_mount()
        # what this translator stopped with signals: their resume needs no cgroup lookup, which
        # for fifty jobs would come before the first of them is continued
        self._signalled: set[ProcessRef] = set()
        self._shared: dict[ProcessRef, float] = {}  # job root → when it was last found without a cgroup of its own

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        if self.mount is None:
            return True, "no cgroup v2 hierarchy here: jobs are paused with signals"
        return True, ""

    def own_cgroup(self, target: JobTarget) -> str | None:
        """The folder of a cgroup that holds the job's processes and nothing else, whose
        ``cgroup.freeze`` this account may write; None otherwise."""
        if self.mount is None or not target.processes:
            return None
        root = target.processes[0]
        if not self._alive(root):
            return None
        rel = cgroup_of(root.pid)
        if rel is None or rel == "/":
            return None  # never the whole hierarchy
        folder = os.path.join(self.mount, rel.lstrip("/"))
        job = {r.pid for r in target.processes}
        members: set[int] = set()
        try:
            for here, _dirs, files in os.walk(folder):  # freezing a folder freezes its children too
                if "cgroup.procs" in files:
                    with open(os.path.join(here, "cgroup.procs")) as fh:
                        members.update(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            return None
        if not members or not members <= job:
            return None  # others share it: freezing it would pause them too
        if members != job:
            return None  # some of the job lives elsewhere: only signals reach all of it
        if not all(self._alive(r) for r in target.processes[1:]):
            return None  # a pid of the job's now names another process, which a freeze would stop
        if not os.access(os.path.join(folder, "cgroup.freeze"), os.W_OK):
            return None
        return folder

    def _own_cgroup_unless_shared(self, target: JobTarget) -> str | None:
        if not target.processes:
            return None
        root, now = target.processes[0], time.monotonic()
        if now - self._shared.get(root, -SHARED_RECHECK_S) < SHARED_RECHECK_S:
            return None
        folder = self.own_cgroup(target)
        if folder is None:
            self._shared = {r: at for r, at in self._shared.items() if now - at < SHARED_RECHECK_S}
            self._shared[root] = now
        return folder

    def _alive(self, ref: ProcessRef) -> bool:
        try:
            return self._signaller.send(ref, 0)  # signal 0: only the start-time check
        except (OSError, ValueError):
            return False

    def _set(self, folder: str, frozen: bool) -> None:
        with open(os.path.join(folder, "cgroup.freeze"), "w") as fh:
            fh.write("1" if frozen else "0")

    @staticmethod
    def is_frozen(folder: str) -> bool:
        """The group reports it has finished freezing."""
        try:
            with open(os.path.join(folder, "cgroup.events")) as fh:
                return "frozen 1" in fh.read().splitlines()
        except OSError:
            return False

    @staticmethod
    def freeze_asked(folder: str) -> bool:
        """A freeze was asked (it may not have completed: a crash in between must still thaw)."""
        try:
            with open(os.path.join(folder, "cgroup.freeze")) as fh:
                return fh.read().strip() == "1"
        except OSError:
            return False

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        folder = self._own_cgroup_unless_shared(target)
        if folder is None:
            paused = super().pause(target)
            self._signalled.update(paused)
            return paused
        self._signalled.difference_update(target.processes)
        try:
            self._set(folder, True)
        except OSError as exc:
            raise PluginError(f"could not freeze {folder} for job {target.name!r}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + self.options.timeout_s
        while not self.is_frozen(folder):
            if time.monotonic() > deadline:
                self._set(folder, False)
                raise PluginError(
                    f"{folder} did not report frozen within {self.options.timeout_s:g}s; job {target.name!r} "
                    "was left running (a task in uninterruptible sleep delays freezing)"
                )
            time.sleep(_POLL_S)
        return list(target.processes)

    def settle(self, refs: Sequence[ProcessRef], timeout_s: float) -> bool:
        # a frozen group was waited for by pause (its tasks read as sleeping, never stopped)
        return super().settle([r for r in refs if r in self._signalled], timeout_s)

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        known = {r for r in refs if r in self._signalled}
        errors = []
        if known:
            try:
                super().resume([r for r in refs if r in known])
            except PluginError as exc:  # the others are still continued
                errors.append(str(exc))
            self._signalled -= known
        # the rest may be frozen, or paused by an earlier daemon: look each one up
        rest = [r for r in refs if r not in known]
        folders = set()
        for ref in rest:
            rel = cgroup_of(ref.pid) if self.mount and self._alive(ref) else None
            if rel and rel != "/":
                folders.add(os.path.join(self.mount or "", rel.lstrip("/")))
        for folder in folders:
            if self.freeze_asked(folder):
                try:
                    self._set(folder, False)
                except OSError as exc:
                    errors.append(f"could not thaw {folder}: {exc.strerror or exc}")
        if rest:  # anything paused with signals instead (or by an earlier daemon) continues too
            try:
                super().resume(rest)
            except PluginError as exc:
                errors.append(str(exc))
        if errors:
            raise PluginError("; ".join(errors))

    def terminate(self, target: JobTarget) -> None:
        folder = self.own_cgroup(target)
        if folder is not None and self.freeze_asked(folder):
            self._set(folder, False)  # a frozen task cannot act on SIGTERM
        super().terminate(target)
