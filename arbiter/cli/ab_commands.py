"""``arbiter ab``: start a paired ON/OFF run or a sweep (after showing its plan), follow it,
and read its report.  The daemon holds the run; these commands only ask."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from arbiter.api.ops import Op
from arbiter.cli.client import CliError
from arbiter.cli.common import ConfigOpt, JsonOpt, ask, console_out, fail, print_json

ab_app = typer.Typer(
    help="Prove co-tenancy: paired ON/OFF runs, sweeps and their reports.", no_args_is_help=True, rich_markup_mode=None
)

RuleOpt = Annotated[str, typer.Option("--rule", help="the protected program's rule id")]
WorkOpt = Annotated[str, typer.Option(help="the work under test: gpu, cpu, all or a job name")]
BlocksOpt = Annotated[int, typer.Option(help="planned blocks of one ON and one OFF window (the pilot may add)")]
WindowOpt = Annotated[float, typer.Option(help="each window, seconds")]
WashoutOpt = Annotated[float, typer.Option(help="seconds discarded after each switch")]
MarginOpt = Annotated[float, typer.Option(help="the slowdown that counts (0.02: 2 %)")]
OffOpt = Annotated[
    str, typer.Option(help="how OFF windows hold the work: paused, or evicted (stopped, freeing its memory)")
]
HoursOpt = Annotated[float, typer.Option("--max-hours", help="the run's cap")]
FollowOpt = Annotated[
    bool, typer.Option("--follow/--detach", help="show progress until it ends (the run outlives the CLI)")
]


YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="start without asking (needed when not on a terminal)")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="show the plan and start nothing")]


def _confirmed(plan: dict[str, Any], yes: bool) -> bool:
    """A run holds other GPU work for hours: it starts only when asked for in so many words."""
    if yes:
        return True
    if not _asks_a_person():
        raise fail(
            CliError(
                "a paired run holds other GPU work while it runs, so it starts only when confirmed: "
                "pass --yes to start it (or --dry-run to see the plan only)",
                2,
            )
        )
    each = " per level" if plan.get("levels") else ""
    return typer.confirm(f"Start it? Other GPU work waits for about {plan['planned_hours']:.1f} h{each}", default=False)


def _asks_a_person() -> bool:
    """Whether a question can be answered: someone types at a terminal."""
    return sys.stdin.isatty()


def _ab_start(op: Op, config: str | None, as_json: bool, follow: bool, yes: bool, dry_run: bool, **args: Any) -> None:
    from arbiter.cli.ab import follow as follow_run
    from arbiter.cli.ab import print_plan

    plan = ask(config, Op.AB_PLAN, "plan", sweep=op is Op.AB_SWEEP, **args)
    console = console_out()
    if as_json and dry_run:
        print_json(plan)
    elif not as_json:
        print_plan(console, plan, started=False)
    if dry_run:
        return
    if not _confirmed(plan, yes):
        print("arbiter: nothing started", file=sys.stderr)
        raise typer.Exit(1)
    plan = ask(config, op, "plan", **args)
    if as_json and not follow:
        print_json(plan)
        return
    if not as_json:
        console.print(f"started  run {plan['run']}" + (f" of sweep {plan['sweep']}" if plan.get("sweep") else ""))
    if not follow:
        return
    last = follow_run(console, lambda: ask(config, Op.AB_STATUS, "runs"), plan["run"], plan.get("sweep"))
    report = ask(config, Op.AB_SHOW, "report", id=last.get("run", plan["run"]))
    _ab_report(report, as_json)
    if not plan.get("sweep"):
        raise typer.Exit(0 if report["certifies"] else 1)
    from arbiter.cli.ab import sweep_summary

    runs = [r for r in ask(config, Op.AB_STATUS, "runs") if r.get("sweep") == plan["sweep"]]
    passed, text = sweep_summary(runs)
    if not as_json:
        print(text)
    raise typer.Exit(0 if passed else 1)


def _ab_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(report)
        return
    from arbiter.harness.report import text

    print(text(report))


@ab_app.command("start")
def ab_start(
    rule: RuleOpt,
    work: WorkOpt = "gpu",
    duty: Annotated[Optional[float], typer.Option(help="the duty cooperative work holds in ON windows")] = None,  # noqa: UP045
    blocks: BlocksOpt = 12,
    window: WindowOpt = 300,
    washout: WashoutOpt = 60,
    margin: MarginOpt = 0.02,
    off: OffOpt = "paused",
    max_hours: HoursOpt = 8,
    follow: FollowOpt = False,
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure what the work costs a protected program: blocks of ON and OFF windows in random order."""
    _ab_start(
        Op.AB_START,
        config,
        as_json,
        follow,
        yes,
        dry_run,
        rule=rule,
        work=work,
        duty=duty,
        blocks=blocks,
        window=window,
        washout=washout,
        margin=margin,
        off=off,
        max_hours=max_hours,
    )


@ab_app.command("sweep")
def ab_sweep(
    rule: RuleOpt,
    levels: Annotated[
        str, typer.Option(help="duties to run in order; it stops at the first that does not pass")
    ] = "0.1,0.2,0.35,0.5,0.65,0.8,1.0",
    work: WorkOpt = "gpu",
    blocks: BlocksOpt = 12,
    window: WindowOpt = 300,
    washout: WashoutOpt = 60,
    margin: MarginOpt = 0.02,
    off: OffOpt = "paused",
    max_hours: HoursOpt = 8,
    follow: FollowOpt = False,
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the harness at each duty in turn: the highest that passes is the rule's certified duty."""
    try:
        parsed = [float(x) for x in levels.split(",") if x.strip()]
    except ValueError:
        raise fail(CliError(f"--levels must be numbers separated by commas, not {levels!r}", 2)) from None
    _ab_start(
        Op.AB_SWEEP,
        config,
        as_json,
        follow,
        yes,
        dry_run,
        rule=rule,
        work=work,
        levels=parsed,
        blocks=blocks,
        window=window,
        washout=washout,
        margin=margin,
        off=off,
        max_hours=max_hours,
    )


@ab_app.command("status")
def ab_status(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    follow: Annotated[bool, typer.Option("--follow", help="follow the run in progress until it ends")] = False,
) -> None:
    """Every paired run: in progress (which window, how far), or its verdict."""
    runs = ask(config, Op.AB_STATUS, "runs")
    current = next((r for r in runs if r["status"] == "running"), None)
    if follow and current is not None:
        from arbiter.cli.ab import follow as follow_run

        follow_run(console_out(), lambda: ask(config, Op.AB_STATUS, "runs"), current["run"], current.get("sweep"))
        runs = ask(config, Op.AB_STATUS, "runs")
    if as_json:
        print_json(runs)
        return
    from arbiter.cli.ab import runs_table

    console_out().print(runs_table(runs))


@ab_app.command("show")
def ab_show(
    run_id: Annotated[str, typer.Argument(help="the run's id (`arbiter ab status`)")],
    plot: Annotated[Optional[Path], typer.Option(help="also write its picture (PNG) here")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A run's report: each block, the blocks left out and why, R with its interval, the verdict."""
    report = ask(config, Op.AB_SHOW, "report", id=run_id)
    if plot is not None:
        from arbiter.harness.report import plot_png

        plot.write_bytes(plot_png(report))
    _ab_report(report, as_json)


@ab_app.command("abort")
def ab_abort(
    run_id: Annotated[str, typer.Argument(help="the run (or sweep) to end")], config: ConfigOpt = None
) -> None:
    """End a run (and its sweep): no certificate, the work goes back to the usual rules."""
    answer = ask(config, Op.AB_ABORT, "run", id=run_id)
    print(f"arbiter: run {answer} aborted")
