"""``arbiter ab``: what a paired run will do before it starts, following it with a
progress bar, and its report (the daemon holds the run; the CLI only asks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

FOLLOW_EVERY_S = 1.0


def print_plan(console: Console, plan: dict[str, Any], started: bool) -> None:
    source = plan["source"]
    where = source.get("path") or source.get("command") or ""
    duty = "as it runs" if plan["duty"] is None else f"{plan['duty']:g}"
    if plan.get("levels"):
        duty += f", then {', '.join(f'{x:g}' for x in plan['levels'])} while each passes (a sweep)"
    rate = plan.get("source_rate")
    console.print(f"rule     {plan['rule']}")
    console.print(f"source   {source['kind']} {where}" + ("" if rate is None else f" (now {rate:.3g} events/s)"))
    console.print(f"work     {plan['work']}: {', '.join(plan['jobs'])} at duty {duty}; off = {plan['off']}")
    console.print(
        f"design   {plan['blocks']} blocks of an ON and an OFF {plan['window_s']:g}s window "
        f"({plan['washout_s']:g}s washout), margin {100 * plan['margin']:g} %"
    )
    console.print(
        f"planned  {plan['planned_hours']:.2f} h per run (at most {plan['max_hours']:g} h; the pilot may add blocks)"
    )
    if started:
        console.print(f"started  run {plan['run']}" + (f" of sweep {plan['sweep']}" if plan.get("sweep") else ""))


def runs_table(runs: list[dict[str, Any]]) -> Table:
    table = Table(title="paired runs")
    for col in ("run", "rule", "work", "duty", "status", "blocks", "left out", "verdict / now"):
        table.add_column(col)
    for r in runs:
        live = r.get("live") or {}
        window = live.get("window")
        now = (
            f"block {window['block']} {window['arm'].upper()} ({window['ends_in_s']:.0f}s left)"
            if window
            else r["verdict"] or r["why"]
        )
        duty = "-" if r["duty"] is None else f"{r['duty']:g}"
        table.add_row(
            r["run"],
            r["rule"],
            r["work"],
            duty,
            r["status"],
            f"{r['blocks_done']}/{r['target']}",
            str(r["excluded"]),
            now,
        )
    return table


def follow(console: Console, ask: Callable[[], list[dict[str, Any]]], run_id: str, sweep: str | None) -> dict[str, Any]:
    """Show the run's progress until it (or its sweep) ends; returns its last status."""
    with Progress(
        TextColumn("{task.description}", markup=False),  # run and rule ids are data
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} blocks"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(run_id, total=1)
        last: dict[str, Any] = {}
        while True:
            runs = ask()
            mine = [r for r in runs if r["run"] == run_id or (sweep and r.get("sweep") == sweep)]
            if not mine:
                return last
            current = next((r for r in mine if r["status"] == "running"), mine[0])
            last = current
            live = current.get("live") or {}
            window = live.get("window")
            what = f"{current['run']} duty {current['duty']}" if current["duty"] is not None else current["run"]
            if window:
                what += f": block {window['block']} {window['arm'].upper()}" + (
                    "" if window["measuring"] else " (washout)"
                )
            bar.update(task, description=what, total=current["target"], completed=current["blocks_done"])
            if all(r["status"] != "running" for r in mine):
                return current
            time.sleep(FOLLOW_EVERY_S)


CERTIFYING = ("no slowdown shown", "slowdown smaller than the margin")


def sweep_summary(runs: list[dict[str, Any]]) -> tuple[list[float], str]:
    """Each level of a sweep and its verdict, and the certified duty: the highest that passed."""
    ordered = sorted(runs, key=lambda r: r["started"])
    passed = [r["duty"] for r in ordered if r["verdict"] in CERTIFYING and r["duty"] is not None]
    lines = [f"sweep {ordered[0]['sweep']} on {ordered[0]['rule']!r}:" if ordered else "sweep: no runs"]
    lines += [f"  duty {r['duty']:g}: {r['verdict'] or r['status']}" for r in ordered]
    lines.append(
        f"certified duty {max(passed):g} (`arbiter certificates`)" if passed else "no level passed: no certificate"
    )
    return passed, "\n".join(lines)
