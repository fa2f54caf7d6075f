"""``access``: what this account may reach of the GPU and of other users' processes.

``arbiter doctor`` asks the daemon to read it, so it says what the daemon's own account can
do: open the GPU's device files (``/dev/dri``, ``/dev/nvidia*``, ``/dev/kfd``), and read other
users' processes' file descriptors (DRM fdinfo needs the same user or CAP_SYS_PTRACE).  Each
problem comes with its fix.
"""

from __future__ import annotations

import glob
import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from arbiter.plugin import HostSignal, KindOptions, PluginContext

DEVICE_PATTERNS = ("dev/dri/renderD*", "dev/dri/card*", "dev/nvidia*", "dev/kfd")


@dataclass(frozen=True)
class AccessItem:
    what: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class AccessReading:
    """``user``: the account read for; ``items``: each check, with a fix where it failed."""

    user: str
    items: tuple[AccessItem, ...] = field(default_factory=tuple)


class AccessOptions(KindOptions):
    kind: Literal["access"] = "access"


class AccessHostSignal(HostSignal):
    Options = AccessOptions

    def __init__(self, options: AccessOptions, context: PluginContext, *, root: Path = Path("/")) -> None:
        super().__init__(options, context)
        self.root = root

    def read(self) -> AccessReading:
        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = str(os.geteuid())
        return AccessReading(user, (*self._devices(user), self._other_users(user)))

    def _devices(self, user: str) -> list[AccessItem]:
        # device nodes only: /dev/nvidia-caps is a folder, and joining a group does not open it
        found = sorted(
            {p for pattern in DEVICE_PATTERNS for p in glob.glob(str(self.root / pattern)) if not os.path.isdir(p)}
        )
        if not found:
            return [AccessItem("GPU device files", True, "none on this host (no GPU driver exposes one)")]
        denied = [p for p in found if not os.access(p, os.R_OK | os.W_OK)]
        if not denied:
            return [AccessItem("GPU device files", True, f"{user} may open all {len(found)}: {', '.join(found[:6])}")]
        return [
            AccessItem(
                "GPU device files",
                False,
                f"{user} may not open {', '.join(denied[:6])}",
                f"add {user} to the groups that own them (usually render and video): sudo usermod -aG render,video {user}",
            )
        ]

    def _other_users(self, user: str) -> AccessItem:
        me = os.geteuid()
        proc = self.root / "proc"
        try:
            pids = [e for e in os.listdir(proc) if e.isdigit()]
        except OSError:
            return AccessItem("other users' processes", True, "no /proc here: nothing to check")
        for pid in pids:
            try:
                if os.stat(proc / pid).st_uid == me:
                    continue
                os.listdir(proc / pid / "fdinfo")
                return AccessItem("other users' processes", True, f"{user} may read their file descriptors (GPU use)")
            except PermissionError:
                return AccessItem(
                    "other users' processes",
                    False,
                    f"{user} may not read other users' file descriptors, so their GPU use reads as unknown (fail safe)",
                    "run the daemon as root, or give it CAP_SYS_PTRACE (and CAP_KILL to pause them)",
                )
            except OSError:
                continue
        return AccessItem("other users' processes", True, "no other user's process runs now")
