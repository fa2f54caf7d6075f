"""The state directory on a real daemon start: the token readable by the daemon's account
only (a file anyone else could have read is replaced), nothing in it writable by others, the
socket open to all (rights are checked per request, SPEC section 4)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from arbiter.daemon.secure import UnsafeStateDir, check_state_dir, ensure_token
from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_fresh_start_leaves_every_file_safe(tmp_path: Path) -> None:
    old = os.umask(0)  # the daemon must not depend on a careful umask
    try:
        node = HarnessNode(tmp_path)
        node.start()
    finally:
        os.umask(old)
    try:
        state = node.state_dir
        assert mode(state / "token") == 0o600
        assert len((state / "token").read_text().strip()) >= 32
        assert mode(state) == 0o755
        assert mode(node.socket) == 0o666 and stat.S_ISSOCK(os.lstat(node.socket).st_mode)
        assert mode(state / "daemon.json") == 0o644
        for path in state.iterdir():
            st = os.lstat(path)
            assert st.st_uid == os.geteuid(), path
            if not stat.S_ISSOCK(st.st_mode):
                assert not st.st_mode & stat.S_IWOTH, f"{path} is writable by others"
    finally:
        node.close()


def test_a_token_others_could_read_is_fixed_and_replaced(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    node.state_dir.mkdir(parents=True)
    leaked = "a-token-that-was-world-readable-for-a-while-0123456789"
    (node.state_dir / "token").write_text(leaked)
    os.chmod(node.state_dir / "token", 0o644)
    try:
        node.start()
        token = (node.state_dir / "token").read_text().strip()
        assert mode(node.state_dir / "token") == 0o600
        assert token != leaked and len(token) >= 32
        assert "others may have read it" in node.log()
    finally:
        node.close()
    # a safe token survives a restart (clients that read it keep working)
    node = HarnessNode(tmp_path)
    try:
        node.start()
        assert (node.state_dir / "token").read_text().strip() == token
    finally:
        node.close()


@pytest.mark.parametrize("case", ["symlink", "hardlink", "short", "directory", "other_owner"])
def test_a_token_file_not_plainly_the_daemons_own_is_replaced(tmp_path: Path, case: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("x" * 40)
    os.chmod(target, 0o600)
    token_path = state / "token"
    if case == "symlink":
        token_path.symlink_to(target)
    elif case == "hardlink":
        os.link(target, token_path)
    elif case == "short":
        token_path.write_text("abc")
        os.chmod(token_path, 0o600)
    elif case == "directory":
        token_path.mkdir()
    else:
        if os.geteuid() != 0:
            pytest.skip("a file owned by another uid needs root to make")
        token_path.write_text("y" * 40)
        os.chmod(token_path, 0o600)
        os.chown(token_path, 65534, 65534)
    if case == "directory":
        with pytest.raises(UnsafeStateDir, match="not a regular file"):
            ensure_token(token_path)  # never silently removed: a person looks at it
        return
    token = ensure_token(token_path)
    st = os.lstat(token_path)
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid() and mode(token_path) == 0o600
    assert token_path.read_text() == token and len(token) >= 32 and token != "x" * 40
    assert target.read_text() == "x" * 40 and mode(target) == 0o600, "what a link pointed to is left alone"


def test_a_world_writable_state_dir_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    check_state_dir(state)
    assert mode(state) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="a state dir owned by another uid needs root to make")
def test_a_state_dir_owned_by_another_account_stops_the_start(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    node.state_dir.mkdir(parents=True)
    os.chown(node.state_dir, 65534, 65534)
    with pytest.raises(UnsafeStateDir, match="owned by uid 65534"):
        check_state_dir(node.state_dir)
    with pytest.raises(RuntimeError, match="owned by uid 65534") as refused:
        node.start(timeout=30)
    assert "Traceback" not in str(refused.value), "the refusal is a message, not a crash"
    assert not (node.state_dir / "token").exists() and not node.socket.exists()
    node.close()


def test_the_socket_is_replaced_not_followed(tmp_path: Path) -> None:
    """A stale path where the socket goes (a file, or a link planted there) is removed, and
    what it pointed to is untouched."""
    node = HarnessNode(tmp_path)
    node.state_dir.mkdir(parents=True)
    bait = tmp_path / "bait"
    bait.write_text("keep me")
    os.chmod(bait, 0o600)
    node.socket.symlink_to(bait)
    try:
        node.start()
        assert stat.S_ISSOCK(os.lstat(node.socket).st_mode)
        assert bait.read_text() == "keep me" and mode(bait) == 0o600
    finally:
        node.close()
    wait_until(lambda: not node.socket.exists(), 10, "the socket to be removed when the daemon stops")
