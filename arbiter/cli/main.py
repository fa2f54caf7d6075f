"""The ``arbiter`` command.  Imports neither the HTTP server nor any plugin up front, so it
starts fast; commands that need plugins (check, plugins, run, schema) load them when run.

It is over 400 lines because it is the command's whole surface: one short function per
command, each importing what it does only when it runs."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from arbiter import __version__
from arbiter.cli.client import Client, CliError, node_config

app = typer.Typer(
    name="arbiter",
    help="Share one GPU between the programs you protect and other GPU work.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    # plain help: options as `--flag / --no-flag`, no type beside a flag, readable in a pipe
    rich_markup_mode=None,
)
job_app = typer.Typer(help="Run and control fleet jobs.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(job_app, name="job")
ab_app = typer.Typer(
    help="Prove co-tenancy: paired ON/OFF runs, sweeps and their reports.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(ab_app, name="ab")

ConfigOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at runtime
    typer.Option("--config", "-c", help="node config (default: $ARBITER_CONFIG, ./arbiter.yaml, ~/.config, /etc)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def _console() -> Any:
    from arbiter.cli.render import console

    return console()


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _fail(exc: CliError) -> typer.Exit:
    print(f"arbiter: {exc}", file=sys.stderr)
    return typer.Exit(exc.exit_code)


def _node_and_plugins(config: str | None) -> tuple[Any, Any]:
    """The node config and its plugin host, or a clear exit."""
    from arbiter.pluginmanager import PluginLoadError, build_plugin_manager

    try:
        cfg, _ = node_config(config)
        return cfg, build_plugin_manager(cfg.plugins, cfg.disable_plugins, timeout_s=cfg.plugin_timeout_s)
    except CliError as exc:
        raise _fail(exc) from None
    except PluginLoadError as exc:
        raise _fail(CliError(str(exc), 2)) from None


def _ask(config: str | None, op: str, key: str, **args: Any) -> Any:
    """One answer from the daemon, or a clear exit."""
    from arbiter.transport import RequestRefused

    try:
        return Client(config).call(op, **args)[key]
    except CliError as exc:
        raise _fail(exc) from None
    except RequestRefused as exc:
        raise _fail(CliError(str(exc))) from None


def _show(data: Any, as_json: bool, printer: str) -> None:
    """JSON, or the named printer of :mod:`arbiter.cli.render` (imported only then)."""
    if as_json:
        _print_json(data)
        return
    from arbiter.cli import render

    getattr(render, printer)(_console(), data)


def _version(value: bool) -> None:
    if value:
        print(f"arbiter {__version__}")
        raise typer.Exit()


class LogFormat(StrEnum):
    text = "text"
    json = "json"


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            "--log-format",
            envvar="ARBITER_LOG_FORMAT",
            help="daemon log lines on stderr: text, or JSON lines for a log collector",
        ),
    ] = LogFormat.text,
) -> None:
    ctx.obj = {"log_format": log_format.value}


@app.command()
def run(ctx: typer.Context, config: ConfigOpt = None) -> None:
    """Run the daemon in the foreground (a service manager runs it like this)."""
    from arbiter.cli.checks import refuse_bad_node_config
    from arbiter.cli.logs import configure
    from arbiter.daemon.service import serve

    configure((ctx.obj or {}).get("log_format", "text"))
    try:
        cfg, path = node_config(config)
        refuse_bad_node_config(cfg, path)
        raise typer.Exit(serve(cfg, path))
    except CliError as exc:
        raise _fail(exc) from None


@app.command()
def status(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="keep it current until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="seconds between two looks, with --watch")] = 2.0,
) -> None:
    """What runs, what is held and why; tenants and their GPU use."""
    if watch:
        from arbiter.cli.watch import watch_status

        watch_status(lambda: _ask(config, "status", "status"), _console(), as_json, interval)
        return
    _show(_ask(config, "status", "status"), as_json, "print_status")


@app.command()
def explain(
    subject: Annotated[Optional[str], typer.Argument(help="a job id (or its scheduler's), job name or tenant")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why is my job not running?  Every hold with its code and remedy."""
    _show(_ask(config, "explain", "explain", subject=subject), as_json, "print_explain")


@app.command()
def timeline(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[int, typer.Option(help="how many of the latest entries")] = 50,
    subject: Annotated[Optional[str], typer.Option(help="only entries about this job or rule")] = None,  # noqa: UP045
    code: Annotated[Optional[str], typer.Option(help="only entries with this code")] = None,  # noqa: UP045
    follow: Annotated[bool, typer.Option("--follow", "-f", help="then print each new entry until Ctrl-C")] = False,
) -> None:
    """What arbiter did and saw, latest last."""

    def ask() -> Any:
        return _ask(config, "timeline", "events", limit=limit, subject=subject, code=code)

    if follow:
        from arbiter.cli.watch import follow_timeline

        follow_timeline(ask, _console(), as_json)
        return
    _show(ask(), as_json, "print_timeline")


@app.command()
def check(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="rule files or directories (default: tenants_dirs)")
    ] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate the node config and rule files; exit non-zero on any problem."""
    from arbiter.cli.checks import run_check

    try:
        problems, checked = run_check(config, paths or [])
    except CliError as exc:
        raise _fail(exc) from None
    if as_json:
        _print_json({"checked": checked, "problems": [p.to_dict() for p in problems]})
    else:
        for p in problems:
            print(str(p))
        print(f"{len(checked)} file(s) checked, {len(problems)} problem(s)", file=sys.stderr)
    raise typer.Exit(1 if problems else 0)


@app.command()
def schema(
    what: Annotated[str, typer.Argument(help="node | rule | manifest | control | event | all")] = "all",
) -> None:
    """Print JSON Schema for arbiter's files and wire protocol."""
    from arbiter.config.schemas import SCHEMAS, schema_for
    from arbiter.pluginmanager import build_plugin_manager

    if what != "all" and what not in SCHEMAS:
        raise _fail(CliError(f"unknown schema {what!r}; choose one of: {', '.join(SCHEMAS)}, all", 2))
    host = build_plugin_manager()  # a rule's plugin blocks and the node's sections are the plugins' own
    try:

        def kinds(family: str) -> dict[str, Any]:
            found = {name: host.options_model(family, name) for name in host.kind_names(family)}
            return {name: model for name, model in found.items() if model is not None}

        _print_json(schema_for(what, kinds, host.section_models()))
    finally:
        host.close()


@app.command()
def plugins(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Every plugin, its distribution, the kinds it registered and the node config sections it reads."""
    _, host = _node_and_plugins(config)
    listing = host.plugins()
    if as_json:
        _print_json(listing)
        return
    from rich.table import Table

    table = Table(title="Plugins")
    for col in ("plugin", "distribution", "kinds", "node config sections"):
        table.add_column(col)
    for p in listing:
        table.add_row(
            p["name"],
            p["distribution"] or ("blocked" if p.get("blocked") else "(module)"),
            ", ".join(p["kinds"]),
            ", ".join(f"{s}:" for s in p["sections"]),
        )
    _console().print(table)


@app.command("resume-all")
def resume_all(config: ConfigOpt = None) -> None:
    """Resume everything a daemon recorded as paused (for a service manager's stop hook)."""
    from arbiter.daemon.service import resume_recorded

    try:
        cfg, _ = node_config(config)
        resumed, failures, reused = resume_recorded(cfg)
    except CliError as exc:
        raise _fail(exc) from None
    print(f"resumed {resumed} item(s)")
    for why in reused:
        print(f"arbiter: {why}")
    for failure in failures:
        print(f"arbiter: could not resume: {failure}", file=sys.stderr)
    raise typer.Exit(1 if failures else 0)


@app.command()
def helper(
    config: ConfigOpt = None,
    socket: Annotated[Optional[str], typer.Option(help="the daemon's socket (default: from the node config)")] = None,  # noqa: UP045
) -> None:
    """Read, in your login, the sources in your home the daemon cannot read; report only counts and phases."""
    import signal
    import threading

    from arbiter.cli.client import daemon_info, state_dir_for
    from arbiter.cli.helper import Helper
    from arbiter.signal_relay import relay_signals

    try:
        state_dir = state_dir_for(config)
        path = socket or str(daemon_info(state_dir)["socket"])
    except CliError as exc:
        raise _fail(exc) from None
    _, host = _node_and_plugins(config)
    stop = threading.Event()
    relay_signals({signal.SIGTERM: stop.set, signal.SIGINT: stop.set})
    Helper(path, host, state_dir).run(stop)


@app.command()
def doctor(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The node's health, each item with a fix: config, plugins, readers, GPU APIs, sources, access."""
    from arbiter.doctor import Item, local_items

    items = [i.to_dict() for i in local_items(config)]
    try:
        items += Client(config).call("doctor", timeout=90)["items"]
    except CliError as exc:
        items.append(
            Item(
                "daemon",
                False,
                str(exc).split(";")[0],
                "start it with `arbiter run` (readers, probes and sources are checked as its account)",
            ).to_dict()
        )
    healthy = all(i["ok"] for i in items)
    _show({"healthy": healthy, "items": items} if as_json else items, as_json, "print_doctor")
    raise typer.Exit(0 if healthy else 1)


@app.command("gpu-apis")
def gpu_apis_command(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    refresh: Annotated[bool, typer.Option(help="run the probes again now")] = False,
) -> None:
    """Which GPU APIs this host (and its containers) provide, with the evidence for each."""
    from arbiter.transport import RequestRefused

    try:
        answer = Client(config).call("gpu-apis", timeout=90, refresh=refresh)["gpu_apis"]
    except CliError:
        answer = _probe_here(config)  # no daemon: ask the probes directly
    except RequestRefused as exc:
        raise _fail(CliError(str(exc))) from None
    _show(answer, as_json, "print_gpu_apis")


def _probe_here(config: str | None) -> dict[str, Any]:
    from arbiter.probing import gpu_apis

    cfg, host = _node_and_plugins(config)
    return gpu_apis(host.kind_names("probes"), cfg.plugins)


@app.command()
def duty(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The GPU budget beside protected programs: its ceiling, each rule's governor, each job's duty."""
    _show(_ask(config, "duty", "duty"), as_json, "print_duty")


@app.command()
def certificates(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Every certificate: valid, expired or stale, and why."""
    _show(_ask(config, "certificates", "certificates"), as_json, "print_certificates")


@app.command()
def conform(
    path: Annotated[Path, typer.Argument(help="a job's folder with conformance.yaml, or the file")],
    spec: Annotated[Optional[str], typer.Option(help="run only this spec")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check that a job holds the duties its conformance.yaml asks, and reports them truly."""
    from arbiter.cli.render import print_conformance
    from arbiter.config.errors import ConfigError
    from arbiter.conform import Kit, load
    from arbiter.daemon.observe import Observer

    cfg, host = _node_and_plugins(config)
    try:
        conf, folder = load(path)
    except (ConfigError, OSError) as exc:
        raise _fail(CliError(str(exc), 2)) from None
    observer = Observer(cfg, host)
    readers = [(name, reader) for name, reader, _ in observer.readers if reader is not None]
    say = (lambda _m: None) if as_json else (lambda m: print(f"arbiter conform: {m}", file=sys.stderr, flush=True))
    kit = Kit(host, readers, say, cfg.plugins)
    try:
        results = kit.run(conf, folder, spec)
    finally:
        kit.close()
        observer.close()
    if spec is not None and not results:
        raise _fail(CliError(f"no spec is called {spec!r} in {folder}", 2))
    if as_json:
        _print_json({"job": str(folder), "results": [r.to_dict() for r in results]})
    else:
        print_conformance(_console(), str(folder), results)
    raise typer.Exit(1 if any(r.verdict == "fail" for r in results) else 0)


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="keep the temporary state directory")] = False,
) -> None:
    """The whole story in about a minute on any machine (a CPU stands in for the GPU)."""
    from arbiter.demo.story import run_demo

    raise typer.Exit(run_demo(keep=keep))


@job_app.command(
    "run",
    # what follows the command is its own: `job run python3 -c X` runs python3 -c X, `--` or not
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False},
)
def job_run(
    cmd: Annotated[
        list[str],
        typer.Argument(metavar="CMD", help="the command and its arguments, after its options (-- is optional)"),
    ],
    config: ConfigOpt = None,
    name: Annotated[Optional[str], typer.Option(help="the job name (trust is kept per owner and name)")] = None,  # noqa: UP045
    manifest: Annotated[Optional[str], typer.Option(help="a job manifest file (YAML)")] = None,  # noqa: UP045
    cooperative: Annotated[
        bool, typer.Option(help="the job obeys its control document (cooperative_throttle and _pause)")
    ] = False,
) -> None:
    """Register a job, wait until it is admitted, run it, exit with its exit code."""
    from arbiter.cli.jobrun import run_job

    if cmd and cmd[0].startswith("-") and cmd[0] != "-":
        raise _fail(CliError(_not_an_option(cmd[0]), 2))
    try:
        raise typer.Exit(run_job(Client(config), list(cmd), name, manifest, cooperative))
    except CliError as exc:
        raise _fail(exc) from None


def _not_an_option(word: str) -> str:
    from arbiter.config.errors import did_you_mean

    known = ["--config", "--name", "--manifest", "--cooperative", "--no-cooperative", "--help"]
    return (
        f"{word} is not an option of `arbiter job run` ({did_you_mean(word, known, 'its options')}); "
        "its options come before the command: arbiter job run --name NAME -- CMD ARGS"
    )


def _job_op(op: str, job_id: str, config: str | None) -> None:
    from arbiter.transport import RequestRefused

    try:
        Client(config).call(op, id=job_id)
    except CliError as exc:
        raise _fail(exc) from None
    except RequestRefused as exc:
        raise _fail(CliError(str(exc), 3 if exc.code == "FORBIDDEN" else 1)) from None


@job_app.command("stop")
def job_stop(job_id: str, config: ConfigOpt = None) -> None:
    """Stop a job: its control document says stop, then it is terminated after a grace period."""
    _job_op("job.stop", job_id, config)


@job_app.command("pause")
def job_pause(job_id: str, config: ConfigOpt = None) -> None:
    """Hold one of your jobs until you resume it."""
    _job_op("job.pause", job_id, config)


@job_app.command("resume")
def job_resume(job_id: str, config: ConfigOpt = None) -> None:
    """Lift your own hold on a job (arbiter's holds stay)."""
    _job_op("job.resume", job_id, config)


def main() -> None:
    app(prog_name="arbiter")  # also under `python -m arbiter`: completion keys on this name


if __name__ == "__main__":
    main()


# --- paired ON/OFF runs -------------------------------------------------------------------------

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
        raise _fail(
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


def _ab_start(op: str, config: str | None, as_json: bool, follow: bool, yes: bool, dry_run: bool, **args: Any) -> None:
    from arbiter.cli.ab import follow as follow_run
    from arbiter.cli.ab import print_plan

    sweep = op == "ab.sweep"
    plan = _ask(config, "ab.plan", "plan", sweep=sweep, **args)
    console = _console()
    if as_json and dry_run:
        _print_json(plan)
    elif not as_json:
        print_plan(console, plan, started=False)
    if dry_run:
        return
    if not _confirmed(plan, yes):
        print("arbiter: nothing started", file=sys.stderr)
        raise typer.Exit(1)
    plan = _ask(config, op, "plan", **args)
    if as_json and not follow:
        _print_json(plan)
        return
    if not as_json:
        console.print(f"started  run {plan['run']}" + (f" of sweep {plan['sweep']}" if plan.get("sweep") else ""))
    if not follow:
        return
    last = follow_run(console, lambda: _ask(config, "ab.status", "runs"), plan["run"], plan.get("sweep"))
    report = _ask(config, "ab.show", "report", id=last.get("run", plan["run"]))
    _ab_report(report, as_json)
    if not plan.get("sweep"):
        raise typer.Exit(0 if report["certifies"] else 1)
    from arbiter.cli.ab import sweep_summary

    runs = [r for r in _ask(config, "ab.status", "runs") if r.get("sweep") == plan["sweep"]]
    passed, text = sweep_summary(runs)
    if not as_json:
        print(text)
    raise typer.Exit(0 if passed else 1)


def _ab_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(report)
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
        "ab.start",
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
        raise _fail(CliError(f"--levels must be numbers separated by commas, not {levels!r}", 2)) from None
    _ab_start(
        "ab.sweep",
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
    runs = _ask(config, "ab.status", "runs")
    current = next((r for r in runs if r["status"] == "running"), None)
    if follow and current is not None:
        from arbiter.cli.ab import follow as follow_run

        follow_run(_console(), lambda: _ask(config, "ab.status", "runs"), current["run"], current.get("sweep"))
        runs = _ask(config, "ab.status", "runs")
    if as_json:
        _print_json(runs)
        return
    from arbiter.cli.ab import runs_table

    _console().print(runs_table(runs))


@ab_app.command("show")
def ab_show(
    run_id: Annotated[str, typer.Argument(help="the run's id (`arbiter ab status`)")],
    plot: Annotated[Optional[Path], typer.Option(help="also write its picture (PNG) here")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A run's report: each block, the blocks left out and why, R with its interval, the verdict."""
    report = _ask(config, "ab.show", "report", id=run_id)
    if plot is not None:
        from arbiter.harness.report import plot_png

        plot.write_bytes(plot_png(report))
    _ab_report(report, as_json)


@ab_app.command("abort")
def ab_abort(
    run_id: Annotated[str, typer.Argument(help="the run (or sweep) to end")], config: ConfigOpt = None
) -> None:
    """End a run (and its sweep): no certificate, the work goes back to the usual rules."""
    answer = _ask(config, "ab.abort", "run", id=run_id)
    print(f"arbiter: run {answer} aborted")
