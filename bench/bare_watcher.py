"""The floor the fast path is held against: a bare watcher of a phase file.

    python bench/bare_watcher.py EVENTS PID

Waits on inotify for writes to EVENTS, reads what was appended, and for each complete line
with a ``phase`` sends PID SIGSTOP (``on``) or SIGCONT (``off``): the least a Python program
can do between a phase line and the signal, with no rules, decisions or checks.
bench/reaction_latency.py runs it beside the daemon's fast path, in interleaved rounds.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import sys

IN_MODIFY = 0x2
IN_CLOEXEC = 0o2000000


def main() -> None:
    path, pid = sys.argv[1], int(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_CLOEXEC)
    if fd < 0 or libc.inotify_add_watch(fd, path.encode(), IN_MODIFY) < 0:
        raise OSError(ctypes.get_errno(), f"inotify on {path}")
    pending = b""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        print("ready", flush=True)
        while True:
            data = os.read(fd, 4096)
            if len(data) < struct.calcsize("iIII"):
                continue
            pending += fh.read()
            *lines, pending = pending.split(b"\n")
            for line in lines:
                phase = json.loads(line).get("phase")
                if phase in ("on", "off"):
                    os.kill(pid, signal.SIGSTOP if phase == "on" else signal.SIGCONT)


if __name__ == "__main__":
    main()
