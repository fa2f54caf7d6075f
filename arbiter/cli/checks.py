"""``arbiter check``: every problem in the node config and every rule file."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from pydantic import ValidationError

from arbiter.cli.client import CliError
from arbiter.cli.nodecheck import node_problems
from arbiter.config.errors import ConfigError, Problem
from arbiter.config.loader import (
    check_paths,
    load_yaml_mapping,
    parse_node_config,
    read_text,
    resolve_paths,
    rule_files,
    validate_kind_options,
)
from arbiter.config.locate import config_candidates, find_config
from arbiter.config.models import NodeConfig
from arbiter.config.ruleset import RuleSet
from arbiter.daemon.ownership import CheckedRule, Overlap, overlaps
from arbiter.pluginmanager import PluginHost, PluginLoadError, build_plugin_manager


def run_check(
    config: str | None, paths: list[Path], found: list[Overlap] | None = None
) -> tuple[list[Problem], list[str]]:
    """Every problem, and the files checked; ``found`` (where given) takes every pair of
    rules that select the same processes, with the rule that owns them."""
    problems: list[Problem] = []
    checked: list[str] = []
    cfg = NodeConfig()
    # a config that failed validation, and did not say which folders it means, is not taken to
    # mean the default ones: their absence would be a problem the user never wrote
    dirs_guessed = False
    config_path = find_config(config)
    if config_path is not None:
        checked.append(str(config_path))
        try:
            cfg = resolve_paths(parse_node_config(read_text(config_path), str(config_path)), config_path)
        except ConfigError as exc:
            problems.extend(exc.problems)
            cfg = _defaults_with_sections(config_path)
            dirs_guessed = "tenants_dirs" not in cfg.model_fields_set
            try:
                cfg = resolve_paths(cfg, config_path)
            except ConfigError:
                pass  # reported already
    try:
        host = build_plugin_manager(cfg.plugins, cfg.disable_plugins)
    except PluginLoadError as exc:
        raise CliError(f"plugins could not be loaded: {exc}", 2) from None
    problems.extend(node_problems(cfg, config_path, host))
    targets = paths or cfg.tenants_paths()
    for target in targets:
        if not target.exists() and not (dirs_guessed and not paths):
            problems.append(Problem(str(target), 0, 0, "", "no such file or directory"))
    # a single file checked may extend a rule in the tenants dirs: look its base up there
    ruleset = check_paths(targets, host.options_model, host.kind_names, bases=cfg.tenants_paths() if paths else ())
    checked.extend(str(p) for p in rule_files(targets))
    for file_problems in ruleset.problems.values():
        problems.extend(file_problems)
    pairs = rule_overlaps(ruleset, host)
    if found is not None:
        found.extend(pairs)
    problems.extend(
        Problem(
            ruleset.files.get(o.second, ""),
            0,
            0,
            "match",
            o.message(),
            f"give one of {o.first!r} and {o.second!r} a higher priority, or narrow one's match",
        )
        for o in pairs
        if o.ambiguous
    )
    return problems, checked


def rule_overlaps(ruleset: RuleSet, host: PluginHost) -> list[Overlap]:
    """The pairs of enabled rules whose matchers select the same made-up processes."""
    rules = []
    for rid, rule in ruleset.rules.items():
        info = host.kind("matchers", rule.match.kind)
        if not rule.enabled or info is None:
            continue
        try:
            matcher = info.cls(validate_kind_options(rule.match, info.cls.Options))
        except Exception:  # its own problem is reported with its file
            continue
        rules.append(CheckedRule(rid, rule.priority, matcher))
    return overlaps(rules)


def _defaults_with_sections(path: Path) -> NodeConfig:
    """The defaults, with what of a node config that failed to validate says which plugins
    to load and the top-level keys that are not arbiter's own: those are judged against the
    plugins' sections all the same."""
    try:
        data, _ = load_yaml_mapping(read_text(path), str(path))
    except ConfigError:
        return NodeConfig()  # not YAML, or not a mapping: reported already
    sections = {k: v for k, v in data.items() if k not in NodeConfig.model_fields}
    loading = {k: data[k] for k in ("plugins", "disable_plugins", "tenants_dirs") if k in data}
    try:
        return NodeConfig(**loading, **sections)
    except ValidationError:  # reported already
        try:
            return NodeConfig(**{k: v for k, v in loading.items() if k != "tenants_dirs"}, **sections)
        except ValidationError:
            return NodeConfig(**sections)


def refuse_bad_node_config(cfg: NodeConfig, path: Path | None) -> None:
    """Start-up refuses what `arbiter check` refuses (a daemon never runs on a kind it lacks),
    and a listener it cannot open; it says loudly what it runs on when no config was found."""
    _refuse_a_busy_port(cfg)
    _say_what_defaults_mean(cfg, path)
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


def _refuse_a_busy_port(cfg: NodeConfig) -> None:
    """The HTTP listener's port must be free: a second daemon on the same port would
    otherwise run without its status page and metrics, and say so only in its log."""
    if not cfg.http.enabled or cfg.http.port == 0:
        return
    family = socket.AF_INET6 if ":" in cfg.http.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener binds
        try:
            probe.bind((cfg.http.host, cfg.http.port))
        except OSError as exc:
            raise CliError(
                f"http.listen {cfg.http.listen} cannot be opened: {exc.strerror or exc} (another arbiter, or another "
                "program, listens there); give this node another port in http.listen (port 0 picks a free one) "
                "or set http.enabled: false",
                2,
            ) from None


def _say_what_defaults_mean(cfg: NodeConfig, path: Path | None) -> None:
    log = logging.getLogger("arbiter")
    if path is None:
        log.warning(
            "no node config found (--config, $ARBITER_CONFIG, %s): running on built-in defaults, state_dir %s, "
            "tenants_dirs %s",
            ", ".join(map(str, config_candidates())),
            cfg.state_path(),
            ", ".join(map(str, cfg.tenants_paths())),
        )
    if not rule_files([d for d in cfg.tenants_paths() if d.is_dir()]):
        log.warning(
            "no rule file in %s: nothing is protected, and fleet work runs as if no program needed the GPU; "
            "drop a rule file there (the shipped tenants.d/ has examples)",
            ", ".join(map(str, cfg.tenants_paths())),
        )
