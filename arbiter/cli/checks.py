"""``arbiter check``: every problem in the node config and every rule file."""

from __future__ import annotations

from pathlib import Path

from arbiter.cli.client import CliError
from arbiter.config.errors import ConfigError, Problem
from arbiter.config.loader import check_paths, parse_node_config, read_text, resolve_paths, rule_files
from arbiter.config.locate import find_config
from arbiter.config.models import NodeConfig
from arbiter.config.nodecheck import node_problems
from arbiter.pluginmanager import PluginLoadError, build_plugin_manager


def run_check(config: str | None, paths: list[Path]) -> tuple[list[Problem], list[str]]:
    problems: list[Problem] = []
    checked: list[str] = []
    cfg = NodeConfig()
    config_path = find_config(config)
    if config_path is not None:
        checked.append(str(config_path))
        try:
            cfg = resolve_paths(parse_node_config(read_text(config_path), str(config_path)), config_path)
        except ConfigError as exc:
            problems.extend(exc.problems)
    try:
        host = build_plugin_manager(cfg.plugins, cfg.disable_plugins)
    except PluginLoadError as exc:
        raise CliError(f"plugins could not be loaded: {exc}", 2) from None
    problems.extend(node_problems(cfg, config_path, host))
    targets = paths or cfg.tenants_paths()
    for target in targets:
        if not target.exists():
            problems.append(Problem(str(target), 0, 0, "", "no such file or directory"))
    # a single file checked may extend a rule in the tenants dirs: look its base up there
    ruleset = check_paths(targets, host.options_model, host.kind_names, bases=cfg.tenants_paths() if paths else ())
    checked.extend(str(p) for p in rule_files(targets))
    for file_problems in ruleset.problems.values():
        problems.extend(file_problems)
    return problems, checked


def refuse_bad_node_config(cfg: NodeConfig, path: Path | None) -> None:
    """Start-up refuses what `arbiter check` refuses: a daemon never runs on a kind it lacks."""
    try:
        host = build_plugin_manager(cfg.plugins, cfg.disable_plugins, timeout_s=cfg.plugin_timeout_s)
    except PluginLoadError as exc:
        raise CliError(str(exc), 2) from None
    try:
        problems = node_problems(cfg, path, host)
    finally:
        host.close()
    if problems:
        raise CliError("the node config is not valid:\n" + "\n".join(map(str, problems)), 2)
