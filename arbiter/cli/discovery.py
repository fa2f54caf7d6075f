"""Where running daemons say they are, so that a command finds one without being told its config.

A daemon started by ``arbiter run`` leaves a pointer while it runs: a small JSON file (its
state dir, socket, node config and pid) in its login session's runtime directory,
``$XDG_RUNTIME_DIR/arbiter/`` (private to that user), or, for root without one (a system
service), in ``/run/arbiter/``, which every user can read.  A command given no config and
finding none in the usual places asks the daemon a pointer names, its user's own first; a
command whose daemon is not running names the daemons it did find.

A pointer is believed only where nobody else could have written it: the user's own runtime
directory, or a root-owned file in a root-owned ``/run/arbiter``; and only while its process
lives and its socket is there.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

SYSTEM_DIR = Path("/run/arbiter")


def _own_dir() -> Path | None:
    """Where this user's daemon leaves its pointer: the login session's runtime directory,
    else, for root (a system service has none), the system one; None: nowhere private."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return Path(runtime) / "arbiter"
        # else not private to this user: a pointer there could be forged
    return SYSTEM_DIR if os.geteuid() == 0 else None


def _trusted(path: Path, owner: int) -> bool:
    try:
        st = path.lstat()
        parent = path.parent.lstat()
    except OSError:
        return False
    return (
        st.st_uid == owner
        and parent.st_uid == owner
        and not parent.st_mode & 0o022
        and not st.st_mode & 0o022
        and path.is_file()
        and not path.is_symlink()
    )


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it lives
    return True


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def publish(state_dir: Path, socket: Path, config: Path | None) -> Path | None:
    """Leave this daemon's pointer (and clear those of daemons that died without clearing
    theirs); returns it, for :func:`withdraw`, or None where there is nowhere to leave one."""
    where = _own_dir()
    if where is None:
        return None
    try:
        where.mkdir(mode=0o755 if where == SYSTEM_DIR else 0o700, parents=True, exist_ok=True)
        for old in where.glob("*.json"):
            data = _read(old)
            if data is None or not _alive(data.get("pid")):
                old.unlink(missing_ok=True)
        name = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16] + ".json"
        info = {
            "pid": os.getpid(),
            "uid": os.geteuid(),
            "state_dir": str(state_dir.resolve()),
            "socket": str(socket),
            "config": None if config is None else str(config.resolve()),
        }
        tmp = where / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(info), encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, where / name)
        return where / name
    except OSError:
        return None  # a pointer is a convenience: its absence only means --config is needed


def withdraw(pointer: Path | None) -> None:
    if pointer is None:
        return
    data = _read(pointer)
    if data is not None and data.get("pid") == os.getpid():
        pointer.unlink(missing_ok=True)


def running() -> list[dict[str, Any]]:
    """The daemons whose pointers can be believed and that run now: this user's (``"scope":
    "user"``), then the system's (``"system"``)."""
    found: dict[str, dict[str, Any]] = {}
    own = _own_dir()
    places = [(own, os.geteuid(), "user")] if own is not None and own != SYSTEM_DIR else []
    places.append((SYSTEM_DIR, 0, "system"))
    for where, owner, scope in places:
        try:
            pointers = sorted(where.glob("*.json"))
        except OSError:
            continue
        for path in pointers:
            data = _read(path) if _trusted(path, owner) else None
            if data is None or not _alive(data.get("pid")) or not isinstance(data.get("state_dir"), str):
                continue
            if not Path(str(data.get("socket"))).exists():
                continue
            found.setdefault(data["state_dir"], {**data, "scope": scope})
    return list(found.values())


def the_one(daemons: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The daemon a command with no config means: this user's own if it has one, else the
    system's; None when there is none.  ValueError when the choice is not clear."""
    for scope in ("user", "system"):
        these = [d for d in daemons if d["scope"] == scope]
        if len(these) == 1:
            return these[0]
        if these:
            raise ValueError(f"more than one daemon runs: {describe(these)}; say which with --config")
    return None


def describe(daemons: list[dict[str, Any]]) -> str:
    """The daemons found, for a message: each one's state dir, config and pid."""
    return "; ".join(
        f"{d['state_dir']} (pid {d['pid']}" + (f", --config {d['config']}" if d.get("config") else "") + ")"
        for d in daemons
    )
