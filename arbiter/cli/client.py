"""Finding the daemon from the node config and talking to it.

Commands that only talk to the daemon read the config's ``state_dir`` without validating the
whole file (no pydantic import), so they start fast; a file they cannot read that way gets
the full validation and its precise error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.api.ops import Op
from arbiter.api.transport import DaemonUnavailable, request
from arbiter.config.locate import default_state_dir, find_config, relative_to_config

if TYPE_CHECKING:
    from arbiter.config.models import NodeConfig


class CliError(Exception):
    """An error the CLI prints as it is and exits non-zero for."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        self.exit_code = exit_code
        super().__init__(message)


#: the exit status of a command that needs the daemon when none answers (sysexits'
#: EX_TEMPFAIL: start it, then try again), apart from 1 (the command failed) and 2 (bad input)
EXIT_NO_DAEMON = 75


class DaemonNotRunning(CliError):
    """No daemon answers for the state dir the config names."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_NO_DAEMON)


def node_config(config: str | None) -> tuple[NodeConfig, Path | None]:
    """The validated node config (for commands that need all of it)."""
    from arbiter.config.errors import ConfigError
    from arbiter.config.loader import load_node_config

    try:
        return load_node_config(config)
    except ConfigError as exc:
        raise CliError(f"the node config is not valid:\n{exc}", 2) from None


def config_or_the_running_ones(config: str | None) -> str | None:
    """For a command that reads the node config itself: ``config``; with none given or found,
    that of the one daemon that says it runs (as the commands that ask it find it)."""
    if find_config(config) is not None:
        return config
    from arbiter.cli.discovery import running, the_one

    try:
        found = the_one(running())
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    return str(found["config"]) if found and found.get("config") else config


def state_dir_for(config: str | None) -> Path:
    """The state dir of the daemon to ask: the config's; with no config given or found, the
    one daemon that says it runs (see :mod:`arbiter.cli.discovery`), else the default."""
    path = find_config(config)
    if path is None:
        from arbiter.cli.discovery import running, the_one

        try:
            found = the_one(running())
        except ValueError as exc:
            raise CliError(str(exc), 2) from None
        return Path(found["state_dir"]) if found else Path(default_state_dir())
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"{path}: no such config file (check --config or $ARBITER_CONFIG)", 2) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        data = False  # let the full validation say exactly what is wrong
    value = data.get("state_dir") if isinstance(data, dict) else None
    if not (data is None or isinstance(data, dict)) or not (value is None or isinstance(value, str)):
        return node_config(config)[0].state_path()
    if value is None and data:
        from arbiter.config.models import NodeConfig

        if set(data) - set(NodeConfig.model_fields):  # a plugin's section, or state_dir misspelt: it says which
            return node_config(config)[0].state_path()
    return relative_to_config(value, path) if value else Path(default_state_dir())


def daemon_info(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "daemon.json"
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        from arbiter.cli.discovery import describe, running

        others = [d for d in running() if Path(d["state_dir"]) != state_dir.resolve()]
        found = f"; running: {describe(others)}" if others else ""
        raise DaemonNotRunning(
            f"no daemon is running for state_dir {state_dir} ({path} is missing); start one with `arbiter run`{found}"
        ) from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


class Client:
    def __init__(self, config: str | None) -> None:
        self.config = config
        self._socket: str | None = None

    @property
    def socket(self) -> str:
        if self._socket is None:
            self._socket = str(daemon_info(state_dir_for(self.config))["socket"])
        return self._socket

    def call(self, op: Op, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
        try:
            return request(self.socket, op, timeout=timeout, **args)
        except DaemonUnavailable as exc:
            raise DaemonNotRunning(f"{exc}; is `arbiter run` running with this config?") from None
