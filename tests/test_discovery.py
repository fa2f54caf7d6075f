"""A daemon is found from a shell that was not told its config, and a command whose daemon
is not running names the ones that are."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.cli import discovery
from arbiter.cli.client import EXIT_NO_DAEMON, CliError, daemon_info, state_dir_for


@pytest.fixture
def pointers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pointers left where this test's daemons would leave them (root's, or the user's)."""
    where = tmp_path / "run-arbiter"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setattr(discovery, "SYSTEM_DIR", where)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("ARBITER_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./arbiter.yaml
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    return runtime / "arbiter"


def state(tmp_path: Path, name: str) -> tuple[Path, Path, socket.socket]:
    """A state dir with a live socket in it."""
    state_dir = tmp_path / name
    state_dir.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(state_dir / "arbiter.sock"))
    return state_dir, state_dir / "arbiter.sock", sock


def test_a_running_daemon_is_found_without_its_config(tmp_path: Path, pointers: Path) -> None:
    state_dir, sock_path, sock = state(tmp_path, "s1")
    with sock:
        pointer = discovery.publish(state_dir, sock_path, tmp_path / "arbiter.yaml")
        assert pointer is not None and pointer.parent == pointers
        assert state_dir_for(None) == state_dir.resolve()
        discovery.withdraw(pointer)
        assert not pointer.exists() and discovery.running() == []


def test_a_dead_daemons_pointer_is_not_believed(tmp_path: Path, pointers: Path) -> None:
    state_dir, sock_path, sock = state(tmp_path, "s1")
    with sock:
        pointer = discovery.publish(state_dir, sock_path, None)
        assert pointer is not None
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        )
        pointer.write_text(json.dumps({**json.loads(pointer.read_text()), "pid": int(dead.stdout)}))
        assert discovery.running() == []


def test_a_pointer_others_could_write_is_not_believed(tmp_path: Path, pointers: Path) -> None:
    state_dir, sock_path, sock = state(tmp_path, "s1")
    with sock:
        pointer = discovery.publish(state_dir, sock_path, None)
        assert pointer is not None
        pointer.chmod(0o666)
        assert discovery.running() == []


def test_two_daemons_ask_for_a_config_and_a_missing_one_names_them(tmp_path: Path, pointers: Path) -> None:
    first, first_sock, s1 = state(tmp_path, "s1")
    second, second_sock, s2 = state(tmp_path, "s2")
    with s1, s2:
        discovery.publish(first, first_sock, tmp_path / "one.yaml")
        # a second daemon of the same user, as from another checkout (a pointer of its own)
        other = json.loads(next(pointers.glob("*.json")).read_text())
        (pointers / "other.json").write_text(
            json.dumps({**other, "state_dir": str(second.resolve()), "socket": str(second_sock)})
        )
        (pointers / "other.json").chmod(0o644)
        with pytest.raises(CliError) as err:
            state_dir_for(None)
        assert err.value.exit_code == 2 and str(first.resolve()) in str(err.value) and "--config" in str(err.value)
        with pytest.raises(CliError) as err:
            daemon_info(tmp_path / "elsewhere")
        assert err.value.exit_code == EXIT_NO_DAEMON
        assert f"running: {first.resolve()} (pid {os.getpid()}, --config {tmp_path / 'one.yaml'})" in str(err.value)


def test_a_users_own_daemon_comes_before_the_systems(
    tmp_path: Path, pointers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, my_sock, s1 = state(tmp_path, "mine")
    system, system_sock, s2 = state(tmp_path, "system")
    with s1, s2:
        discovery.publish(mine, my_sock, None)
        if os.geteuid() == 0:  # only root writes the system's pointer
            monkeypatch.delenv("XDG_RUNTIME_DIR")
            discovery.publish(system, system_sock, None)
            assert state_dir_for(None) == system.resolve()  # a service's shell: only the system's
            monkeypatch.setenv("XDG_RUNTIME_DIR", str(pointers.parent))
            assert {d["scope"] for d in discovery.running()} == {"user", "system"}
        assert state_dir_for(None) == mine.resolve()
