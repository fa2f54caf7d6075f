"""`arbiter --version`, shell completion and `--log-format json`, from real processes."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from arbiter import __version__
from arbiter.cli.logs import JsonFormatter, configure
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until

ARBITER = [sys.executable, "-m", "arbiter"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ARBITER, *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def test_version() -> None:
    out = cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"arbiter {__version__}"


def test_show_completion_prints_a_bash_script() -> None:
    # typed at a bash prompt: the shell is detected among the command's parents, and a test
    # run started outside any shell (a detached CI step, a daemonised runner) has none
    out = subprocess.run(
        ["bash", "-c", '"$@"; exit $?', "bash", *ARBITER, "--show-completion"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "_ARBITER_COMPLETE=complete_bash" in out.stdout
    assert "complete " in out.stdout and " arbiter" in out.stdout


def test_completion_completes_commands_and_options() -> None:
    env = {**os.environ, "_ARBITER_COMPLETE": "complete_bash", "COMP_WORDS": "arbiter sta", "COMP_CWORD": "1"}
    out = cli(env=env)
    assert out.returncode == 0, out.stderr
    assert "status" in out.stdout.split()
    env = {**env, "COMP_WORDS": "arbiter --log-format ", "COMP_CWORD": "2"}
    assert set(cli(env=env).stdout.split()) == {"text", "json"}


def test_an_unknown_log_format_is_refused() -> None:
    out = cli("--log-format", "yaml", "run")
    assert out.returncode == 2
    assert "yaml" in out.stderr and "text" in out.stderr
    out = cli("run", env={**os.environ, "ARBITER_LOG_FORMAT": "yaml"})  # a unit's Environment= works too
    assert out.returncode == 2 and "yaml" in out.stderr


def test_json_records_carry_the_exception() -> None:
    stream = io.StringIO()
    handler = configure("json", stream=stream)
    try:
        try:
            raise RuntimeError("tick\nfailed")
        except RuntimeError:
            logging.getLogger("arbiter.daemon").exception("tick failed")
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "arbiter.daemon" and record["message"] == "tick failed"
    assert "RuntimeError: tick\nfailed" in record["exception"]
    assert isinstance(JsonFormatter().format(logging.makeLogRecord({"msg": "x"})), str)


def test_each_request_an_http_library_makes_is_not_a_line_but_its_warnings_are() -> None:
    stream = io.StringIO()
    handler = configure("text", stream=stream)
    try:
        logging.getLogger("httpx").info('HTTP Request: GET http://127.0.0.1:11434/api/ps "HTTP/1.1 200 OK"')
        logging.getLogger("httpx").warning("a warning")
        logging.getLogger("arbiter").info("arbiter running")
    finally:
        logging.getLogger().removeHandler(handler)
    said = stream.getvalue()
    assert "HTTP Request" not in said and "a warning" in said and "arbiter running" in said


def test_the_daemon_logs_json_lines(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    log_path = tmp_path / "stderr.log"
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            [*ARBITER, "--log-format", "json", "run", "--config", str(node.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=node.env(),
        )
    try:
        node.daemon = daemon

        def running() -> bool:
            assert daemon.poll() is None, log_path.read_text()  # it exited: fail now, with its log
            return "arbiter running" in log_path.read_text()

        wait_until(running, 60, "the daemon to log that it runs", poll_s=0.05)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        node.close()
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    started = next(r for r in records if r["message"].startswith("arbiter running"))
    assert started["level"] == "INFO" and started["logger"] == "arbiter" and started["time"].endswith("+00:00")


def test_the_daemon_logs_text_by_default(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.start()
        node.stop()
    finally:
        node.close()
    running = next(line for line in node.log().splitlines() if "arbiter running" in line)
    assert not running.startswith("{") and " INFO arbiter: arbiter running" in running
