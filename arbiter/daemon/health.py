"""What the daemon checks of its own health, as its own account: each item with a fix.

``arbiter doctor`` shows these beside what the CLI checks itself (:mod:`arbiter.cli.doctor`):
which reader reads GPU time and which cannot and why, the translators in use and whether the
reflex process runs, the GPU API probes run again, each rule's sources, its access to the
GPU's device files and to other users' processes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.reflex.act import default_translators

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts


@dataclass(frozen=True)
class Item:
    area: str
    ok: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def daemon_items(daemon: Parts) -> list[Item]:
    """What the daemon checks as its own account (runs the probes again)."""
    items: list[Item] = []
    # what each reader said on the last tick: reading them again here would disturb the
    # counters the tick compares from one reading to the next
    results = dict(daemon.ticker.observer.reader_results)
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
    if about := daemon.ticker.observer.table_about:
        items.append(Item("process table", True, about))
    items += fast_path_items(daemon)
    for live in daemon.rulebook.ordered():
        rid = live.rule.id
        for fault in live.faults:
            items.append(Item(f"rule {rid}", False, fault, "fix the plugin block named; `arbiter check` shows it"))
        view = daemon.snapshot.view
        obs = view.rules.get(rid) if view else None
        for src in daemon.intake.book.view(rid, 0.0):
            items.append(source_item(rid, src, bool(obs and obs.running)))
    access = daemon.ticker.observer.host_signal("access")
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


def fast_path_items(daemon: Parts) -> list[Item]:
    """The translator serving each action (and those tried before it), and whether the
    reflex process, the fast path for immediate rules, runs."""
    items = []
    chosen = daemon.actuator.translators
    for need in ("pause", "control", "terminate"):
        order = daemon.config.translators.get(need) or default_translators(daemon.host, need)
        named = "named in the node config" if daemon.config.translators.get(need) else "by rank"
        if need in chosen:
            items.append(Item(f"{need} translator", True, f"{chosen[need][0]} (tried {', '.join(order)}, {named})"))
        else:
            items.append(
                Item(
                    f"{need} translator",
                    False,
                    f"none of {', '.join(order) or 'no installed translator'} is available here: GPU fleet work is held",
                    f"install a translator plugin that can {need} on this host, or name one under translators: {need}",
                )
            )
    off = daemon.intake.reflex_off
    if daemon.intake.linked is not None:
        items.append(Item("reflex process", True, "runs: phase changes of immediate rules pause work at once"))
    elif daemon.config.reflex_process:
        fix = "name a bounded pause translator first under translators: pause (`arbiter doctor` lists them)"
        items.append(Item("reflex process", False, f"off: {off}; the decision thread acts on phase changes", fix))
    else:
        items.append(Item("reflex process", True, f"off: {off}; the decision thread acts on phase changes"))
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
