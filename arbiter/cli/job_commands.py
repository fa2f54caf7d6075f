"""``arbiter job``: run a command as a fleet job, and stop, pause or resume one."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from arbiter.api.ops import Op
from arbiter.cli.client import Client, CliError
from arbiter.cli.common import ConfigOpt, ask, fail

job_app = typer.Typer(help="Run and control fleet jobs.", no_args_is_help=True, rich_markup_mode=None)


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
        raise fail(CliError(_not_an_option(cmd[0]), 2))
    try:
        raise typer.Exit(run_job(Client(config), list(cmd), name, manifest, cooperative))
    except CliError as exc:
        raise fail(exc) from None


def _not_an_option(word: str) -> str:
    from arbiter.config.errors import did_you_mean

    known = ["--config", "--name", "--manifest", "--cooperative", "--no-cooperative", "--help"]
    return (
        f"{word} is not an option of `arbiter job run` ({did_you_mean(word, known, 'its options')}); "
        "its options come before the command: arbiter job run --name NAME -- CMD ARGS"
    )


JobArg = Annotated[str, typer.Argument(metavar="JOB", help="a job's id, or the name of one running job")]


def _act(config: str | None, op: Op, job: str) -> None:
    answer = ask(config, op, None, id=job)
    print(f"job {answer.get('job', job)}: {answer.get('did', 'done')}")


@job_app.command("stop")
def job_stop(job: JobArg, config: ConfigOpt = None) -> None:
    """Stop a job: its control document says stop, then it is terminated after a grace period."""
    _act(config, Op.JOB_STOP, job)


@job_app.command("pause")
def job_pause(job: JobArg, config: ConfigOpt = None) -> None:
    """Hold one of your jobs until you resume it."""
    _act(config, Op.JOB_PAUSE, job)


@job_app.command("resume")
def job_resume(job: JobArg, config: ConfigOpt = None) -> None:
    """Lift your own hold on a job (arbiter's holds stay)."""
    _act(config, Op.JOB_RESUME, job)
