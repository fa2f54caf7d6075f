"""Finding the daemon from the node config and talking to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arbiter.config.errors import ConfigError
from arbiter.config.loader import load_node_config
from arbiter.config.models import NodeConfig
from arbiter.transport import DaemonUnavailable, request


class CliError(Exception):
    """An error the CLI prints as it is and exits non-zero for."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        self.exit_code = exit_code
        super().__init__(message)


def node_config(config: str | None) -> tuple[NodeConfig, Path | None]:
    try:
        return load_node_config(config)
    except ConfigError as exc:
        raise CliError(f"the node config is not valid:\n{exc}", 2) from None


def daemon_info(cfg: NodeConfig) -> dict[str, Any]:
    path = cfg.state_path() / "daemon.json"
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise CliError(
            f"no daemon is running for state_dir {cfg.state_path()} ({path} is missing); start one with `arbiter run`"
        ) from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


class Client:
    def __init__(self, config: str | None) -> None:
        self.cfg, self.config_path = node_config(config)
        self._socket: str | None = None

    @property
    def socket(self) -> str:
        if self._socket is None:
            self._socket = str(daemon_info(self.cfg)["socket"])
        return self._socket

    def call(self, op: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
        try:
            return request(self.socket, op, timeout=timeout, **args)
        except DaemonUnavailable as exc:
            raise CliError(f"{exc}; is `arbiter run` running with this config?") from None
