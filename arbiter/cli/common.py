"""What the ``arbiter`` command's groups share: the options every command takes, and asking
the daemon, loading the plugins and printing, each ending in a clear exit when it fails."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from arbiter.api.ops import Op
from arbiter.cli.client import Client, CliError, node_config

if TYPE_CHECKING:
    from arbiter.api.transport import RequestRefused

ConfigOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at runtime
    typer.Option("--config", "-c", help="node config (default: $ARBITER_CONFIG, ./arbiter.yaml, ~/.config, /etc)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def console_out() -> Any:
    from arbiter.cli.render import console

    return console()


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def fail(exc: CliError) -> typer.Exit:
    print(f"arbiter: {exc}", file=sys.stderr)
    return typer.Exit(exc.exit_code)


def node_and_plugins(config: str | None) -> tuple[Any, Any]:
    """The node config and its plugin host, or a clear exit."""
    from arbiter.pluginmanager import PluginLoadError, build_plugin_manager

    try:
        cfg, _ = node_config(config)
        return cfg, build_plugin_manager(cfg.plugins, cfg.disable_plugins, timeout_s=cfg.plugin_timeout_s)
    except CliError as exc:
        raise fail(exc) from None
    except PluginLoadError as exc:
        raise fail(CliError(str(exc), 2)) from None


#: the exit status of a request the daemon refuses because the caller may not make it
FORBIDDEN_EXIT = 3


def refused(exc: RequestRefused) -> typer.Exit:
    """The exit for a request the daemon refused: 3 when the caller may not make it, else 1."""
    return fail(CliError(str(exc), FORBIDDEN_EXIT if exc.code == "FORBIDDEN" else 1))


def ask(config: str | None, op: Op, key: str | None, **args: Any) -> Any:
    """The daemon's answer to ``op`` (its ``key`` where one is named), or a clear exit."""
    from arbiter.api.transport import RequestRefused

    try:
        answer = Client(config).call(op, **args)
    except CliError as exc:
        raise fail(exc) from None
    except RequestRefused as exc:
        raise refused(exc) from None
    return answer if key is None else answer[key]


def show(data: Any, as_json: bool, printer: str) -> None:
    """JSON, or the named printer of :mod:`arbiter.cli.render` (imported only then)."""
    if as_json:
        print_json(data)
        return
    from arbiter.cli import render

    getattr(render, printer)(console_out(), data)
