"""Where the node config and the state directory are, without validating anything.

Kept free of pydantic so that CLI commands that only talk to the daemon start fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CONFIG_ENV = "ARBITER_CONFIG"


def config_candidates() -> list[Path]:
    """Where a config is looked for.  Root never takes one from the working folder: any
    account may have left an ``arbiter.yaml`` (and a state folder it names) where root
    happens to run a command; ``--config`` names one on purpose."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    here = [] if os.geteuid() == 0 else [Path("arbiter.yaml")]
    return [*here, Path(xdg) / "arbiter" / "arbiter.yaml", Path("/etc/arbiter/arbiter.yaml")]


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """``--config``, else ``$ARBITER_CONFIG``, else the first default location that exists."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return next((p for p in config_candidates() if p.is_file()), None)


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/arbiter"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "arbiter")


def relative_to_config(value: str, config_path: Path) -> Path:
    """Relative paths in a config file mean relative to that file."""
    return config_path.resolve().parent / Path(value).expanduser()


def shipped_tenants_dir() -> Path | None:
    """The default rule files that come with arbiter: ``tenants.d`` beside the package in a
    checkout, ``<prefix>/share/arbiter/tenants.d`` in an installed wheel."""
    here = Path(__file__).resolve().parents[2]
    for candidate in (here / "tenants.d", Path(sys.prefix) / "share" / "arbiter" / "tenants.d"):
        if candidate.is_dir():
            return candidate
    return None
