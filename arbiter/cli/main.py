"""The ``arbiter`` command.  Imports neither the HTTP server nor any plugin up front, so it
starts fast; commands that need plugins (check, plugins, run, schema) load them when run.

Each command is one short function that imports what it does only when it runs; the
``job`` and ``ab`` groups have modules of their own."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from arbiter import __version__
from arbiter.api.ops import Op
from arbiter.cli.ab_commands import ab_app
from arbiter.cli.client import Client, CliError, node_config
from arbiter.cli.common import (
    ConfigOpt,
    JsonOpt,
    ask,
    console_out,
    fail,
    node_and_plugins,
    print_json,
    refused,
    show,
)
from arbiter.cli.job_commands import job_app

app = typer.Typer(
    name="arbiter",
    help="Share one GPU between the programs you protect and other GPU work.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    # plain help: options as `--flag / --no-flag`, no type beside a flag, readable in a pipe
    rich_markup_mode=None,
)
app.add_typer(job_app, name="job")
app.add_typer(ab_app, name="ab")


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
    from arbiter.cli.serve import refuse_a_second_daemon, serve

    configure((ctx.obj or {}).get("log_format", "text"))
    try:
        cfg, path = node_config(config)
        refuse_a_second_daemon(cfg)
        refuse_bad_node_config(cfg, path)
        raise typer.Exit(serve(cfg, path))
    except CliError as exc:
        raise fail(exc) from None


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

        watch_status(lambda: ask(config, Op.STATUS, "status"), console_out(), as_json, interval)
        return
    show(ask(config, Op.STATUS, "status"), as_json, "print_status")


@app.command()
def explain(
    subject: Annotated[Optional[str], typer.Argument(help="a job id (or its scheduler's), job name or tenant")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why is my job not running?  Every hold with its code and remedy."""
    show(ask(config, Op.EXPLAIN, "explain", subject=subject), as_json, "print_explain")


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

    def latest() -> Any:
        return ask(config, Op.TIMELINE, "events", limit=limit, subject=subject, code=code)

    if follow:
        from arbiter.cli.watch import follow_timeline

        follow_timeline(latest, console_out(), as_json)
        return
    show(latest(), as_json, "print_timeline")


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
    from arbiter.daemon.ownership import Overlap, overlap_lines

    found: list[Overlap] = []
    try:
        problems, checked = run_check(config, paths or [], found)
    except CliError as exc:
        raise fail(exc) from None
    if as_json:
        print_json(
            {
                "checked": checked,
                "problems": [p.to_dict() for p in problems],
                "overlaps": [
                    {"rules": [o.first, o.second], "process": o.process, "owner": o.owner, "why": o.why} for o in found
                ],
            }
        )
    else:
        for p in problems:
            print(str(p))
        for line in overlap_lines(found):
            print(line)
        print(f"{len(checked)} file(s) checked, {len(problems)} problem(s)", file=sys.stderr)
    raise typer.Exit(1 if problems else 0)


@app.command()
def rules(
    rule_id: Annotated[Optional[str], typer.Argument(metavar="[ID]", help="one rule: its effective form")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Each rule and the processes its match: selects now; with ID, its effective form after
    extends: and the near misses, with the field that missed.  Needs no daemon; with no config
    given or found, it reads that of the daemon that runs."""
    from arbiter.cli.selects import show_rules

    show_rules(config, rule_id, as_json)


@app.command()
def schema(
    what: Annotated[str, typer.Argument(help="node | rule | manifest | control | event | all")] = "all",
) -> None:
    """Print JSON Schema for arbiter's files and wire protocol."""
    from arbiter.config.schemas import SCHEMAS, schema_for
    from arbiter.pluginmanager import build_plugin_manager

    if what != "all" and what not in SCHEMAS:
        raise fail(CliError(f"unknown schema {what!r}; choose one of: {', '.join(SCHEMAS)}, all", 2))
    host = build_plugin_manager()  # a rule's plugin blocks and the node's sections are the plugins' own
    try:

        def kinds(family: str) -> dict[str, Any]:
            found = {name: host.options_model(family, name) for name in host.kind_names(family)}
            return {name: model for name, model in found.items() if model is not None}

        print_json(schema_for(what, kinds, host.section_models()))
    finally:
        host.close()


@app.command()
def plugins(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Every plugin, its distribution, the kinds it registered and the node config sections it reads."""
    _, host = node_and_plugins(config)
    listing = host.plugins()
    if as_json:
        print_json(listing)
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
    console_out().print(table)


@app.command("resume-all")
def resume_all(config: ConfigOpt = None) -> None:
    """Resume everything a daemon recorded as paused (for a service manager's stop hook)."""
    from arbiter.cli.serve import resume_recorded

    try:
        cfg, _ = node_config(config)
        resumed, failures, reused = resume_recorded(cfg)
    except CliError as exc:
        raise fail(exc) from None
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
    from arbiter.cli.signal_relay import relay_signals

    try:
        state_dir = state_dir_for(config)
        path = socket or str(daemon_info(state_dir)["socket"])
    except CliError as exc:
        raise fail(exc) from None
    _, host = node_and_plugins(config)
    stop = threading.Event()
    relay_signals({signal.SIGTERM: stop.set, signal.SIGINT: stop.set})
    Helper(path, host, state_dir).run(stop)


@app.command()
def doctor(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The node's health, each item with a fix: config, plugins, readers, GPU APIs, sources, access."""
    from arbiter.api.transport import RequestRefused
    from arbiter.cli import render
    from arbiter.cli.doctor import local_items
    from arbiter.daemon.health import Item

    items = [i.to_dict() for i in local_items(config)]
    if not as_json:  # what is known now, while the daemon runs its checks
        render.print_doctor_items(console_out(), items)
    print(
        "arbiter doctor: the daemon checks its readers, GPU APIs (probed again), sources and access "
        "as its own account; this takes a few seconds...",
        file=sys.stderr,
        flush=True,
    )
    try:
        remote = Client(config).call(Op.DOCTOR, timeout=90)["items"]
    except RequestRefused as exc:
        raise refused(exc) from None
    except CliError as exc:
        remote = [
            Item(
                "daemon",
                False,
                str(exc).split(";")[0],
                "start it with `arbiter run` (readers, probes and sources are checked as its account)",
            ).to_dict()
        ]
    items += remote
    healthy = all(i["ok"] for i in items)
    if as_json:
        print_json({"healthy": healthy, "items": items})
    else:
        render.print_doctor_items(console_out(), remote)
        render.print_doctor_summary(console_out(), items)
    raise typer.Exit(0 if healthy else 1)


@app.command("gpu-apis")
def gpu_apis_command(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    refresh: Annotated[bool, typer.Option(help="run the probes again now")] = False,
) -> None:
    """Which GPU APIs this host (and its containers) provide, with the evidence for each."""
    from arbiter.api.transport import RequestRefused

    try:
        answer = Client(config).call(Op.GPU_APIS, timeout=90, refresh=refresh)["gpu_apis"]
    except CliError:
        answer = _probe_here(config)  # no daemon: ask the probes directly
    except RequestRefused as exc:
        raise refused(exc) from None
    show(answer, as_json, "print_gpu_apis")


def _probe_here(config: str | None) -> dict[str, Any]:
    from arbiter.probing import gpu_apis

    cfg, host = node_and_plugins(config)
    return gpu_apis(host.kind_names("probes"), cfg.plugins)


@app.command()
def duty(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The GPU budget beside protected programs: its ceiling, each rule's governor, each job's duty."""
    show(ask(config, Op.DUTY, "duty"), as_json, "print_duty")


@app.command()
def certificates(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Every certificate: valid, expired or stale, and why; where each came from, and the twins'
    certificates in the shared folder."""
    answer = ask(config, Op.CERTIFICATES, None)
    show(answer["certificates"] if as_json else answer, as_json, "print_fleet_certificates")


@app.command()
def conform(
    path: Annotated[Path, typer.Argument(help="a job's folder with conformance.yaml, or the file")],
    spec: Annotated[Optional[str], typer.Option(help="run only this spec")] = None,  # noqa: UP045
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check that a job holds the duties its conformance.yaml asks, and reports them truly."""
    from arbiter.cli.conform import Kit, load
    from arbiter.cli.render import print_conformance
    from arbiter.config.errors import ConfigError
    from arbiter.daemon.observe import Observer

    cfg, host = node_and_plugins(config)
    try:
        conf, folder = load(path)
    except (ConfigError, OSError) as exc:
        raise fail(CliError(str(exc), 2)) from None
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
        raise fail(CliError(f"no spec is called {spec!r} in {folder}", 2))
    if as_json:
        print_json({"job": str(folder), "results": [r.to_dict() for r in results]})
    else:
        print_conformance(console_out(), str(folder), results)
    raise typer.Exit(1 if any(r.verdict == "fail" for r in results) else 0)


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="keep the temporary state directory")] = False,
    proof: Annotated[
        bool, typer.Option(help="instead, a short paired ON/OFF run that earns a certificate, then the governor")
    ] = False,
) -> None:
    """The whole story in under half a minute on any machine (a CPU stands in for the GPU)."""
    from arbiter.cli.proof import run_proof
    from arbiter.cli.story import run_demo

    raise typer.Exit((run_proof if proof else run_demo)(keep=keep))


def main() -> None:
    app(prog_name="arbiter")  # also under `python -m arbiter`: completion keys on this name


if __name__ == "__main__":
    main()
