"""``arbiter doctor``: the node's health, each item with a fix.

Two halves: what the CLI checks itself (the node config, the rule files, the plugins), and
what the running daemon checks as its own account (which reader reads GPU time and which
cannot and why, the GPU API probes run again, each rule's sources, its access to the GPU's
device files and to other users' processes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arbiter.daemon.facade import Node


@dataclass(frozen=True)
class Item:
    area: str
    ok: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def local_items(config: str | None) -> list[Item]:
    """The config, the rule files and the plugins, as the CLI's own account sees them."""
    from arbiter.config.errors import ConfigError
    from arbiter.config.loader import check_paths, load_node_config
    from arbiter.config.nodecheck import node_problems
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


def daemon_items(daemon: Node) -> list[Item]:
    """What the daemon checks as its own account (runs the probes again)."""
    items: list[Item] = []
    # what each reader said on the last tick: reading them again here would disturb the
    # counters the tick compares from one reading to the next
    results = dict(daemon.observer.reader_results)
    reading_one = any(ok for ok, _ in results.values())
    for name, (ok, detail) in results.items():
        fix = (
            ""
            if ok
            else (
                "needed only where no other reader reads this GPU"
                if reading_one
                else "install this GPU's driver and library, or check the access items below"
            )
        )
        items.append(Item(f"reader {name}", ok or reading_one, detail, fix))
    if not reading_one:
        items.append(
            Item(
                "GPU time",
                False,
                "no reader reads per-process GPU time here: protected programs count as "
                "using the GPU (fail safe) and certified runs no GPU work",
                "install the reader plugin for this GPU, or check its permissions below",
            )
        )
    apis = daemon.prober.refresh(wait_s=60.0) or {"evidence": {"probes": "they did not answer within 60s"}}
    items.append(
        Item(
            "GPU APIs",
            True,
            f"host provides {', '.join(apis.get('host') or []) or 'none'}; containers get "
            f"{', '.join(apis.get('containers') or []) or 'none'}",
        )
    )
    provided = set(apis.get("host") or []) | ({"containers"} if apis.get("containers") else set())
    for api, evidence in sorted((apis.get("evidence") or {}).items()):
        # an API this host lacks is no fault of the node; the fix says what would provide it
        fix = (
            ""
            if api in provided
            else f"jobs that need {api} run elsewhere; install its driver where this host has such a GPU"
        )
        items.append(Item(f"GPU API {api}", True, ("usable: " if api in provided else "not usable: ") + evidence, fix))
    for live in daemon.rulebook.ordered():
        rid = live.rule.id
        for fault in live.faults:
            items.append(Item(f"rule {rid}", False, fault, "fix the plugin block named; `arbiter check` shows it"))
        view = daemon.snapshot.view
        obs = view.rules.get(rid) if view else None
        for src in daemon.sources.view(rid, 0.0):
            items.append(source_item(rid, src, bool(obs and obs.running)))
    access = daemon.observer.host_signal("access")
    for check in getattr(access, "items", ()):
        items.append(Item(f"{check.what} ({getattr(access, 'user', '?')})", check.ok, check.detail, check.fix))
    if daemon.recorder.failures:
        items.append(
            Item(
                "state database",
                False,
                f"{daemon.recorder.failures} write(s) failed: {daemon.recorder.last_error}",
                f"check free space and permissions of {Path(daemon.state_dir)}",
            )
        )
    return items


def source_item(rid: str, src: dict[str, Any], running: bool) -> Item:
    """One source of a rule.  A source that cannot be read while its program is not running
    is no fault (a server that is not started refuses connections; a log is not written yet):
    it is read once the program starts, and the program's phase counts only while it runs."""
    what = f"{src['slot']} ({src['kind']})"
    if src["readable"] and not running and src.get("rate"):
        return Item(
            f"rule {rid} source",
            False,
            f"{what} advances at {src['rate']:g}/s while no process matches {rid}'s match: block (it protects nothing)",
            f"`arbiter rules {rid}` shows what its match: selects and the near misses, with the field that missed",
        )
    if src["readable"]:
        return Item(f"rule {rid} source", True, f"{what} read by {src['read_by']}")
    if src["needs_helper"]:
        return Item(
            f"rule {rid} source",
            False,
            f"{what}: {src['why']}",
            "run `arbiter helper` in the session of the user who owns the file",
        )
    if not running:
        return Item(f"rule {rid} source", True, f"{what}: not read while {rid} is not running ({src['why']})")
    return Item(
        f"rule {rid} source",
        False,
        f"{what}: {src['why']}, while {rid} runs",
        "check that the source's options (path, URL, port) are where the program writes or listens, "
        "and that the daemon's account may read them",
    )
