"""`arbiter run` refuses a listener it cannot open, and says loudly what it runs on when it
found no config or no rule file."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from arbiter.cli.checks import refuse_bad_node_config
from arbiter.cli.client import CliError
from arbiter.config.models import NodeConfig
from arbiter_testing.node import HarnessNode, start_up


def test_a_busy_http_port_stops_start_up(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "arbiter.yaml"
        config.write_text(f"state_dir: {tmp_path / 'state'}\ntenants_dirs: []\nhttp: {{listen: '127.0.0.1:{port}'}}\n")
        out = start_up(config)
    assert out.returncode == 2, out.stderr
    assert f"http.listen 127.0.0.1:{port} cannot be opened" in out.stderr and "port 0" in out.stderr
    assert not (tmp_path / "state" / "daemon.json").exists()


def test_no_config_and_no_rules_are_said_loudly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = NodeConfig(state_dir=str(tmp_path / "state"), tenants_dirs=[str(tmp_path / "tenants.d")])
    with caplog.at_level(logging.WARNING, logger="arbiter"):
        refuse_bad_node_config(cfg, None)
    said = caplog.text
    assert "no node config found" in said and str(tmp_path / "state") in said
    assert "no rule file in" in said and "nothing is protected" in said


def test_a_config_with_rules_starts_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "tenants.d").mkdir()
    (tmp_path / "tenants.d" / "a.yaml").write_text("id: a\nmatch: {name: [a]}\n")
    (tmp_path / "arbiter.yaml").write_text("")
    cfg = NodeConfig(state_dir=str(tmp_path / "state"), tenants_dirs=[str(tmp_path / "tenants.d")])
    with caplog.at_level(logging.WARNING, logger="arbiter"):
        refuse_bad_node_config(cfg, tmp_path / "arbiter.yaml")
    assert caplog.text == ""


def test_a_stand_in_reader_fails_start_up_too(tmp_path: Path) -> None:
    cfg = NodeConfig(readers=["cpu_time"], state_dir=str(tmp_path), tenants_dirs=[])
    with pytest.raises(CliError) as err:
        refuse_bad_node_config(cfg, None)
    assert err.value.exit_code == 2 and "stand_in_gpu: true" in str(err.value)


@pytest.mark.slow
def test_a_second_daemon_on_the_same_state_dir_is_told_the_first_runs(tmp_path: Path) -> None:
    """Not the port it would share with the first: the daemon that holds it, and how to see it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = HarnessNode(tmp_path, http={"listen": f"127.0.0.1:{port}"})
    try:
        node.start()
        out = start_up(node.config_path)
        assert out.returncode == 1, out.stderr
        assert f"a daemon already runs with state_dir {node.state_dir}" in out.stderr, out.stderr
        assert "`arbiter status` shows it" in out.stderr and "cannot be opened" not in out.stderr
    finally:
        node.close()
