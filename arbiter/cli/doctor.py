"""``arbiter doctor``'s own half: the node config, the rule files and the plugins, as the
CLI's account sees them.  The daemon's half, checked as the daemon's account, is
:mod:`arbiter.daemon.health`.
"""

from __future__ import annotations

from arbiter.daemon.health import Item


def local_items(config: str | None) -> list[Item]:
    """The config, the rule files and the plugins, as the CLI's own account sees them."""
    from arbiter.cli.nodecheck import node_problems
    from arbiter.config.errors import ConfigError
    from arbiter.config.loader import check_paths, load_node_config
    from arbiter.pluginmanager import PluginLoadError, build_plugin_manager

    items = []
    try:
        cfg, path = load_node_config(config)
    except ConfigError as exc:
        return [Item("node config", False, str(exc).splitlines()[0], "fix it; `arbiter check` lists every problem")]
    try:
        host = build_plugin_manager(cfg.plugins, cfg.disable_plugins, timeout_s=cfg.plugin_timeout_s)
    except PluginLoadError as exc:
        return [Item("plugins", False, str(exc), "install the plugin, or remove it from plugins: in arbiter.yaml")]
    problems = node_problems(cfg, path, host)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        items.append(Item("node config", False, f"{problems[0]}{more}", "fix it; `arbiter check` lists every problem"))
    else:
        items.append(Item("node config", True, f"{path or 'built-in defaults'} is valid (gpu_jobs: {cfg.gpu_jobs})"))
    listing = host.plugins()
    items.append(Item("plugins", True, f"{len(listing)} loaded: " + ", ".join(sorted(p["name"] for p in listing))))
    dirs = cfg.tenants_paths()
    ruleset = check_paths(dirs, host.options_model, host.kind_names)
    if ruleset.problems:
        count = sum(len(p) for p in ruleset.problems.values())
        first = next(iter(ruleset.problems.values()))[0]
        items.append(
            Item(
                "rule files",
                False,
                f"{count} problem(s), first: {first}",
                "run `arbiter check` and fix what it reports",
            )
        )
    elif not ruleset.rules:
        items.append(
            Item(
                "rule files",
                False,
                f"no rule file in {', '.join(map(str, dirs))}: nothing is protected",
                "drop a rule file in tenants.d/ (see the shipped ones)",
            )
        )
    else:
        items.append(
            Item("rule files", True, f"{len(ruleset.rules)} rule(s) valid: {', '.join(sorted(ruleset.rules))}")
        )
    return items
