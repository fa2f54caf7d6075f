"""Certificates: proof that GPU work at a duty did not slow a protected program, and whether
each still holds.

A certificate names the node, the rule, the work (``gpu``, ``cpu``, ``all`` or a job name),
the duty, R with its interval, the margin and the run that earned it.  It is valid for 14
days, and only while the node (CPU model, GPU names, OS and major version, arbiter version)
and the protected program (executable path and SHA-256) are those it was earned under.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from arbiter import __version__

VALID_S = 14 * 24 * 3600
FUTURE_SLACK_S = 300.0  # clocks of machines that issued and check a certificate may differ this much
Status = Literal["valid", "expired", "stale"]


@dataclass(frozen=True)
class Certificate:
    rule: str
    work: str
    duty: float
    r: float
    r_low: float
    r_high: float
    margin: float
    run_id: str
    issued_at: float  # wall clock
    node: str
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    exe_path: str = ""
    exe_sha256: str = ""
    id: int | None = None
    superseded: str = ""  # why a later run retired it ("" while it stands)
    origin: str = ""  # the node that earned it, where it was adopted from a twin ("" earned here)
    confirm_blocks: int = 0  # the blocks of the confirmation run that adopted it

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fingerprint": dict(self.fingerprint)}


#: the parts of a fingerprint that must be the same for a certificate to hold
FINGERPRINT_PARTS = ("cpu", "gpus", "driver", "os", "arbiter")


def part(fp: Mapping[str, Any], name: str) -> Any:
    """One part of a fingerprint; a fingerprint recorded before drivers were has an unknown one ("")."""
    return fp.get(name, "" if name == "driver" else None)


def fingerprint(machine: Mapping[str, Any] | None, gpus: list[str], driver: str = "") -> dict[str, Any]:
    """What a certificate is earned on: CPU model, GPU names, GPU driver and its version (where
    the reader reports it), OS and major version, arbiter."""
    machine = machine or {}
    release = platform.release().split(".")[0]
    return {
        "cpu": str(machine.get("cpu_model") or platform.processor() or platform.machine()),
        "gpus": sorted(gpus),
        "driver": driver,
        "os": str(machine.get("os") or f"{sys.platform} {release}"),
        "arbiter": __version__,
    }


def status(
    cert: Certificate, now_wall: float, current: Mapping[str, Any], exe: tuple[str, str] | None
) -> tuple[Status, str]:
    """Whether ``cert`` holds now, and why not.  ``exe`` is the protected program's (path,
    SHA-256) now, or None when it does not run (then only its age and the node count)."""
    age = now_wall - cert.issued_at
    if cert.superseded:
        return "stale", cert.superseded
    if age < -FUTURE_SLACK_S:  # a clock set back: its age cannot be told, so it does not hold
        return "stale", (
            f"issued {-age / 86400:.1f} days from now by this machine's clock (was it set back?); "
            f"run `arbiter ab sweep --rule {cert.rule}` again"
        )
    if age >= VALID_S:
        return (
            "expired",
            f"issued {age / 86400:.1f} days ago; certificates hold 14 days (run `arbiter ab sweep --rule {cert.rule}`)",
        )
    changed = [k for k in FINGERPRINT_PARTS if part(cert.fingerprint, k) != part(current, k)]
    if changed:
        what = ", ".join(f"{k} was {part(cert.fingerprint, k)!r}, now {part(current, k)!r}" for k in changed)
        return "stale", f"the node changed: {what}"
    if exe is not None:
        path, digest = exe
        if path != cert.exe_path:
            return "stale", f"the protected program is now {path}, not {cert.exe_path}"
        if digest != cert.exe_sha256:
            return "stale", f"{path} changed (SHA-256 {digest[:12]}…, earned under {cert.exe_sha256[:12]}…)"
    return "valid", f"valid for {(VALID_S - age) / 86400:.1f} more days"


class ExeHasher:
    """SHA-256 of executables, cached by (path, size, mtime): hashing runs on the tick."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], str] = {}
        self._lock = threading.Lock()

    def digest(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (path, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            return None
        with self._lock:
            self._cache[key] = h.hexdigest()
            while len(self._cache) > 256:
                del self._cache[next(iter(self._cache))]
        return h.hexdigest()
