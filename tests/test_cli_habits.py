"""What a new user types: a command without `--`, a misspelt option, no daemon yet, and the
lines `job run` prints while its job waits and runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from arbiter.api.transport import RequestRefused
from arbiter.cli import common, jobrun, main
from arbiter.cli.client import EXIT_NO_DAEMON, CliError
from arbiter.cli.common import FORBIDDEN_EXIT


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `job run` would run, without a daemon."""
    seen: dict[str, Any] = {}

    def fake(client: Any, cmd: list[str], name: str | None, manifest: str | None, cooperative: bool) -> int:
        seen.update(cmd=cmd, config=client.config, name=name)
        return 0

    monkeypatch.setattr(jobrun, "run_job", fake)
    return seen


@pytest.mark.parametrize(
    "args",
    [
        ["python3", "-c", "print(1)"],  # forgot the --: -c is python's, not --config
        ["--", "python3", "-c", "print(1)"],
    ],
)
def test_the_command_keeps_its_own_options(ran: dict[str, Any], args: list[str]) -> None:
    out = CliRunner().invoke(main.app, ["job", "run", *args])
    assert out.exit_code == 0, out.output
    assert ran == {"cmd": ["python3", "-c", "print(1)"], "config": None, "name": None}


def test_options_before_the_command_are_arbiters(ran: dict[str, Any]) -> None:
    out = CliRunner().invoke(main.app, ["job", "run", "--name", "n", "-c", "a.yaml", "python3", "--name", "x"])
    assert out.exit_code == 0, out.output
    assert ran == {"cmd": ["python3", "--name", "x"], "config": "a.yaml", "name": "n"}


def test_a_misspelt_option_is_not_run_as_the_command(ran: dict[str, Any]) -> None:
    out = CliRunner().invoke(main.app, ["job", "run", "--nme", "n", "--", "python3"])
    assert out.exit_code == 2 and not ran
    assert "--nme is not an option of `arbiter job run` (did you mean '--name'?" in out.output


def test_no_daemon_has_its_own_exit_status(tmp_path: Path) -> None:
    config = tmp_path / "arbiter.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\ntenants_dirs: []\n")
    for args in (["status"], ["explain"], ["job", "run", "--", "true"]):
        out = subprocess.run(
            [sys.executable, "-m", "arbiter", *args[:2], "--config", str(config), *args[2:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == EXIT_NO_DAEMON, (args, out.stderr)
        assert "no daemon is running" in out.stderr


@pytest.mark.parametrize(
    ("args", "code", "status"),
    [
        (["job", "stop", "batch-7"], "FORBIDDEN", FORBIDDEN_EXIT),
        (["job", "pause", "batch-7"], "NO_SUCH_JOB", 1),
        (["explain", "batch-7"], "FORBIDDEN", FORBIDDEN_EXIT),
        (["ab", "abort", "r1"], "FORBIDDEN", FORBIDDEN_EXIT),
        (["ab", "abort", "r1"], "AB_REFUSED", 1),
        (["gpu-apis"], "FORBIDDEN", FORBIDDEN_EXIT),
        (["doctor"], "BUSY", 1),
    ],
)
def test_a_refusal_exits_with_what_it_was(
    monkeypatch: pytest.MonkeyPatch, args: list[str], code: str, status: int
) -> None:
    """A request the caller may not make exits 3, any other refusal 1, with the daemon's words."""

    class Refusing:
        def __init__(self, config: str | None) -> None:
            pass

        def call(self, op: str, **_args: Any) -> dict[str, Any]:
            raise RequestRefused(f"{op}: refused for this test", code)

    for module in (common, main):
        monkeypatch.setattr(module, "Client", Refusing)
    out = CliRunner().invoke(main.app, args)
    assert out.exit_code == status and "refused for this test" in out.output, out.output


def verdict(state: str, *codes: str, duty: float = 1.0, figure: int = 1) -> dict[str, Any]:
    return {
        "state": state,
        "admitted": state != "held",
        "duty": duty,
        "reasons": [{"code": c, "message": f"it uses {figure}% of the GPU"} for c in codes],
    }


def test_job_run_says_each_change_once() -> None:
    said = []
    before = None
    for answer in [
        verdict("held", "PROTECTED_GPU_BUSY", figure=30),
        verdict("held", "PROTECTED_GPU_BUSY", figure=31),  # a figure moved: nothing new to say
        verdict("held", "PROTECTED_GPU_BUSY", figure=29),
        verdict("run"),
        verdict("run"),
        verdict("paused", "PROTECTION_PHASE_ON"),
        verdict("paused", "PROTECTION_PHASE_ON"),
        verdict("run"),
        verdict("run", duty=0.5),
    ]:
        line, before = jobrun.change(before, answer, "j1")
        if line:
            said.append(line)
    assert said == [
        "waiting: PROTECTED_GPU_BUSY: it uses 30% of the GPU (arbiter explain j1)",
        "job j1 runs",
        "job j1 paused: PROTECTION_PHASE_ON: it uses 1% of the GPU (arbiter explain j1)",
        "job j1 resumed",
        "job j1 runs at duty 0.50",
    ]


@pytest.mark.parametrize("command", [["job", "run"], ["ab", "start"], ["status"], []])
def test_help_shows_no_type_beside_a_flag(command: list[str]) -> None:
    out = CliRunner().invoke(main.app, [*command, "--help"])
    assert out.exit_code == 0 and "--help" in out.output
    assert "<bool>" not in out.output and "\x1b[" not in out.output


def test_a_manifest_without_a_name_takes_the_one_given_with_name(tmp_path: Path) -> None:
    from arbiter.cli.jobrun import build_manifest

    manifest = tmp_path / "job.yaml"
    manifest.write_text("gpu: {use: shared}\n")
    assert build_manifest(["python3"], "render-batch", str(manifest), False)["name"] == "render-batch"
    with pytest.raises(CliError, match="name"):  # without --name, the manifest must say it
        build_manifest(["python3"], None, str(manifest), False)
