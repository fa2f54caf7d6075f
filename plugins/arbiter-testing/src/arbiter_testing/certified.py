"""A protected stand-in under a rule, the certificate a passing paired run stores for it, and
the reference job pinned to the stand-in's core: what the certified-duty tests and the
governor bench set up before a job asks for a duty.

The stand-in is ``arbiter.demo.protected``, writing one ``step_done`` line a frame to its
events file; the rule matches its command line with that file in it, so that on a shared box
a rule protects this stand-in alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil

from arbiter.state.certificates import Certificate, ExeHasher
from arbiter.state.store import Store
from arbiter_testing.node import PYTHON, HarnessNode

#: the core the stand-in (which pins itself to the lowest it may use) and a pinned job share
CORE = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0


def stand_in_cmd(events: Path, *args: str) -> list[str]:
    """The protected stand-in's command line, writing its frames to ``events``."""
    return [PYTHON, "-m", "arbiter.demo.protected", "--events", str(events), *args]


def stand_in_rule(events: Path, max_slowdown: float | None = None, rule_id: str = "frames") -> dict[str, Any]:
    """A rule that protects the stand-in writing to ``events``, its progress read from that file."""
    protect: dict[str, Any] = {"source": {"kind": "jsonl", "path": str(events), "event": "step_done"}}
    if max_slowdown is not None:
        protect["max_slowdown"] = max_slowdown
    return {"id": rule_id, "match": {"cmdline": [f"arbiter.demo.protected --events {events}"]}, "protect": protect}


def certify(node: HarnessNode, pid: int, rule: str, duty: float, run_id: str = "test") -> None:
    """Store a certificate for ``rule`` at ``duty``, as a passing paired run stores it, for the
    program of process ``pid``; return once the daemon holds it valid."""
    exe = psutil.Process(pid).exe()
    store = Store(node.state_dir / "state.db")
    try:
        store.add_certificate(
            Certificate(
                rule=rule,
                work="gpu",
                duty=duty,
                r=0.995,
                r_low=0.985,
                r_high=1.004,
                margin=0.02,
                run_id=run_id,
                issued_at=time.time(),
                node="here",
                fingerprint=node.call("certificates")["node"],
                exe_path=exe,
                exe_sha256=ExeHasher().digest(exe) or "",
            )
        )
    finally:
        store.close()
    node.wait_for(
        lambda: any(c["rule"] == rule and c["status"] == "valid" for c in node.call("certificates")["certificates"])
    )


def pinned(*args: str) -> list[str]:
    """``python ARGS`` run on :data:`CORE` alone, where the stand-in runs."""
    pin = f"import os, sys; os.sched_setaffinity(0, {{{CORE}}}); os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
    return [PYTHON, "-c", pin, *args]


def llmbatch_cmd(out: str | Path = "/dev/null") -> list[str]:
    """The reference job (``examples/llmbatch``, its stand-in backend) on :data:`CORE`, without
    end, its answers written to ``out``; run it from the example's folder."""
    return pinned("-m", "llmbatch", "run", "--repeat", "0", "--steps", "4", "--width", "120", "--out", str(out))
