"""docs/getting-started.md, done as a new user does it: every command on the page, in order,
in its own terminal where the page says so, with the files the page shows.

What differs from a person at a keyboard, and why: the folder is the test's own instead of
~/arbiter-try; the protected program runs 20 s instead of 60, under this interpreter rather
than the first `python3` on the PATH; the HTTP listener takes a free port (tests run side by
side); and the terminals after the first get a runtime dir of their own (the daemon's pointer
is how they find it without the config, as the page says).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from arbiter import __version__
from arbiter_testing import wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PAGE = "getting-started.md"
STATUS = [sys.executable, "-m", "arbiter", "status", "--json"]
DOC_DIR = "~/arbiter-try"
PROTECTED_S = "20"
#: not run here, each with why
LEFT_OUT = {
    "git clone": "the test runs in the checkout",
    "uv sync": "the test runs in the checkout's environment",
    "uv run arbiter demo": "tests/e2e/test_demo.py runs the demo",
}


def code_blocks(page: str, lang: str) -> list[tuple[str, str]]:
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("docs_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    blocks: list[tuple[str, str]] = module.code_blocks(page, lang)
    return blocks


def commands() -> list[str]:
    """Every `$ ` command of the page's console blocks, in order."""
    return [
        line[2:].strip()
        for _, text in code_blocks(PAGE, "console")
        for line in text.splitlines()
        if line.startswith("$ ")
    ]


def expected_output(command: str) -> list[str]:
    """The lines the page shows under a command."""
    for _, text in code_blocks(PAGE, "console"):
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line == f"$ {command}":
                rest = []
                for after in lines[i + 1 :]:
                    if after.startswith("$ "):
                        break
                    rest.append(after)
                return rest
    return []


def argv(command: str, where: Path) -> list[str]:
    words = [w.replace(DOC_DIR, str(where)) for w in shlex.split(command, comments=True)]
    assert words[:2] == ["uv", "run"], command
    words = words[2:]
    if words[0] == "arbiter":
        return [sys.executable, "-m", "arbiter", *words[1:]]
    if words[0] == "python":
        words = [sys.executable, *words[1:]]
        if "--seconds" in words:
            words[words.index("--seconds") + 1] = PROTECTED_S
        return words
    raise AssertionError(f"the page runs {command!r}: teach this test what it does")


class Terminals:
    """The processes the page starts, ended at the end of the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.Popen[str]:
        proc = subprocess.Popen(args, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # Ctrl-C, as the page says
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def ours(status: subprocess.CompletedProcess[str], where: Path) -> bool:
    """Whether ``status`` is the answer of the daemon whose state is under ``where``."""
    if status.returncode != 0:
        return False
    try:
        return str(where) in json.loads(status.stdout)["state_dir"]
    except (ValueError, KeyError, TypeError):
        return False


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, env=env, text=True, capture_output=True, timeout=60, check=False)


def test_getting_started_command_by_command(tmp_path: Path) -> None:
    where = tmp_path / "arbiter-try"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    plain = {k: v for k, v in os.environ.items() if k != "ARBITER_CONFIG"}
    plain["XDG_RUNTIME_DIR"] = str(runtime)
    first = dict(plain)  # the first terminal, where the config is exported
    files = {name: text for lang in ("yaml", "python") for name, text in code_blocks(PAGE, lang) if name}
    terminals = Terminals()
    done: list[str] = []
    job: subprocess.Popen[str] | None = None
    try:
        for command in commands():
            if any(command.startswith(skip) for skip in LEFT_OUT):
                continue
            done.append(command)
            if command.startswith("mkdir "):
                subprocess.run([w.replace(DOC_DIR, str(where)) for w in shlex.split(command)], check=True)
                continue
            if command.startswith("export ARBITER_CONFIG="):
                first["ARBITER_CONFIG"] = command.split("=", 1)[1].replace(DOC_DIR, str(where))
                # "Save the two files as ...": the page's node config and rule file
                (where / "arbiter.yaml").write_text(
                    files["arbiter.yaml"].replace(DOC_DIR, str(where)) + "http: {listen: '127.0.0.1:0'}\n"
                )
                (where / "tenants.d" / "trainer.yaml").write_text(
                    files["tenants.d/trainer.yaml"].replace(DOC_DIR, str(where))
                )
                (where / "trainer" / "main.py").write_text(files["trainer/main.py"])
                continue
            if command.startswith("cd "):
                # "start the protected program as you would start your trainer"
                folder, launch = command[3:].split(" && ")
                assert launch.split()[:2] == ["python3", "main.py"], command
                terminals.start(
                    [sys.executable, "main.py", PROTECTED_S], plain, cwd=Path(folder.replace(DOC_DIR, str(where)))
                )

                def trainer() -> dict[str, Any]:
                    rule: dict[str, Any] = json.loads(run(STATUS, plain).stdout)["rules"][0]
                    return rule

                # "arbiter status now shows my-trainer running and using the GPU, and its sources"
                wait_until(lambda: trainer()["using_gpu"], 30, "my-trainer to use the (stand-in) GPU")
                shown = run([sys.executable, "-m", "arbiter", "status"], plain).stdout
                assert "my-trainer" in shown and "Sources" in shown
                continue
            args = argv(command, where)
            if command == "uv run arbiter --version":
                out = run(args, plain)
                assert out.returncode == 0 and out.stdout.strip() == f"arbiter {__version__}"
            elif command == "uv run arbiter check":
                out = run(args, first)
                assert out.returncode == 0, out.stdout + out.stderr
                assert (out.stdout + out.stderr).strip() == expected_output(command)[0]
            elif command == "uv run arbiter run":
                daemon = terminals.start(args, first)

                # its own answer: another daemon running on the machine (the system's) answers too
                # until this one has left its pointer
                def answers(d: subprocess.Popen[str] = daemon) -> bool:
                    return d.poll() is not None or ours(run(STATUS, plain), where)

                wait_until(answers, 30, "the daemon to answer a second terminal")
                assert daemon.poll() is None, daemon.communicate()
            elif command.startswith("uv run arbiter rules "):
                out = run(args, plain)
                assert out.returncode == 0, out.stderr
                # "the processes its match: selects now (here python3 main.py 60)"
                selected = out.stdout.split("selects now:")[1].splitlines()[1]
                assert selected.endswith(f" main.py {PROTECTED_S}"), out.stdout
            elif command.startswith("uv run arbiter job run"):
                job = terminals.start(args, plain)
                waited = job.stderr.readline() + job.stderr.readline() if job.stderr else ""
                assert "registered" in waited and "waiting: PROTECTED_GPU_BUSY" in waited, waited
            elif command.startswith("uv run arbiter explain"):
                out = run(args, plain)
                assert out.returncode == 0, out.stderr
                said = out.stdout.splitlines()
                assert said[0].endswith(" waits (not started)") and said[1].startswith("PROTECTED_GPU_BUSY ")
                # the reason may wrap onto more lines (its figures vary); the remedy follows it
                remedy = next(line.strip() for line in said[2:] if line.strip().startswith("→"))
                assert remedy.startswith("→ nothing to do"), said
            else:
                raise AssertionError(f"the page runs {command!r}: teach this test what it does")
        assert job is not None, "the page runs no job"
        # "the job is admitted, prints `batch work done` and `arbiter job run` exits 0"
        printed, err = job.communicate(timeout=120)
        assert job.returncode == 0 and "batch work done" in printed, err
        assert "admitted" in err
        timeline = run([sys.executable, "-m", "arbiter", "timeline", "--json"], plain)
        seen = [e["code"] for e in json.loads(timeline.stdout)]
        steps = ["PROTECTION_GPU_ON", "JOB_HELD", "PROTECTION_GPU_OFF", "JOB_ADMITTED", "JOB_EXITED"]
        at = [seen.index(code) for code in steps]
        assert at == sorted(at), seen
    finally:
        terminals.close()
    assert done == [c for c in commands() if not any(c.startswith(skip) for skip in LEFT_OUT)]
