"""Attacks by the account ``nobody`` on what a root daemon writes and reads back: job
folders swapped for links while they are made, a state folder below a folder the attacker
owns, a state and config the attacker left in root's working folder, the database read."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from arbiter.api.transport import RequestRefused, request
from arbiter.daemon.jobs import EVENTS_FILE
from arbiter.state.journal import PausedEntry, PausedJournal
from arbiter_testing import run_as
from arbiter_testing.node import PYTHON, HarnessNode

from .conftest import Background, needs_root

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def secret_file(folder: Path, name: str) -> Path:
    """A root-only file the attacker wants: ``name`` in a root-only ``folder``."""
    folder.mkdir(mode=0o755, exist_ok=True)
    path = folder / name
    path.write_text("root's own\n")
    os.chmod(path, 0o600)
    return path


def swap_job_folders(sock: str, jobs: str, target: str, seconds: float) -> dict[str, object]:
    """As the attacker: register jobs of its own and, beside that, swap each new job folder
    for a link to ``target`` (whose events file is a root-only file), so that the daemon's
    ``chown`` of the events file lands on root's file."""
    deadline = time.monotonic() + seconds
    registered = [0]
    refusals: set[str] = set()

    def register() -> None:
        while time.monotonic() < deadline:
            try:
                request(sock, "job.register", manifest={"name": "swap"}, cmd=["true"])
                registered[0] += 1
            except RequestRefused as exc:
                refusals.add(exc.code)

    thread = threading.Thread(target=register)
    thread.start()
    swapped, denied = 0, set()
    while time.monotonic() < deadline:
        try:
            names = os.listdir(jobs)
        except OSError as exc:
            denied.add(f"listdir: {exc.strerror}")
            continue
        for name in names:
            if not name.startswith("swap-") or os.path.islink(os.path.join(jobs, name)):
                continue
            try:
                os.rename(os.path.join(jobs, name), os.path.join(jobs, f".{name}"))
                os.symlink(target, os.path.join(jobs, name))
                swapped += 1
            except OSError as exc:
                denied.add(exc.strerror or str(exc))
    thread.join()
    return {"registered": registered[0], "swapped": swapped, "denied": sorted(denied), "refusals": sorted(refusals)}


@needs_root
def test_job_folders_swapped_for_links_never_give_the_attacker_a_file(shared_root: Path) -> None:
    """Under umask 000 the daemon still makes ``jobs/`` 0755 and each job's folder and events
    file through open folders: the attacker can neither swap a folder nor have the daemon's
    ``chown`` follow one."""
    secret = secret_file(shared_root / "secret", EVENTS_FILE)
    node = HarnessNode(shared_root)
    old = os.umask(0)
    try:
        node.start()
    finally:
        os.umask(old)
    try:
        result = Background(
            "nobody", lambda: swap_job_folders(str(node.socket), str(node.state_dir / "jobs"), str(secret.parent), 3.0)
        ).join()
        assert result["registered"] > 0, result  # the attack ran: its jobs were made
        assert result["swapped"] == 0, result
        st = os.lstat(secret)
        assert (st.st_uid, mode(secret)) == (0, 0o600), f"the root-only file changed hands: {result}"
        jobs = node.state_dir / "jobs"
        assert mode(jobs) == 0o755 and os.lstat(jobs).st_uid == 0
        for folder in jobs.iterdir():
            assert mode(folder) == 0o755 and os.lstat(folder).st_uid == 0, folder
            events = os.lstat(folder / EVENTS_FILE)
            assert (events.st_uid, stat.S_IMODE(events.st_mode)) == (NOBODY, 0o644), folder
    finally:
        node.close()


@needs_root
def test_a_state_dir_below_a_folder_another_account_owns_stops_the_start(shared_root: Path) -> None:
    """Whoever owns a folder above the state folder may rename what is below it at any time:
    the daemon refuses to start there, naming the folder, and makes nothing."""
    theirs = shared_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    node = HarnessNode(theirs)  # the config written there is root's: only the folder is theirs
    with pytest.raises(RuntimeError, match=rf"the folder {theirs} is owned by uid {NOBODY}"):
        node.start(timeout=30)
    node.close()
    assert not node.state_dir.exists()


def test_a_state_dir_below_a_folder_others_may_write_stops_the_start(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # writable by all, no sticky bit: anyone may rename what is in it
    node = HarnessNode(shared)
    with pytest.raises(RuntimeError, match="writable by its group and everyone"):
        node.start(timeout=30)
    node.close()


@needs_root
def test_the_database_and_its_side_files_are_the_daemons_alone(shared_root: Path) -> None:
    """The database holds every rule file's text (headers with tokens included): under umask
    000 it and its -wal and -shm files are still 0600, and ``nobody`` can open none."""
    node = HarnessNode(shared_root)
    node.add_rule(
        "prot",
        {
            "id": "prot",
            "match": {"cmdline": [f"arbiter.demo.protected --events {shared_root / 'p.jsonl'}"]},
            "protect": {"metric": "gpu_share"},
        },
    )
    old = os.umask(0)
    try:
        node.start()
    finally:
        os.umask(old)
    try:
        node.call("timeline")  # the daemon has written: every side file exists
        files = [node.state_dir / f"state.db{suffix}" for suffix in ("", "-wal", "-shm")]
        assert all(f.exists() for f in files)
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}

        def read_them() -> list[str]:
            outcome = []
            for f in files:
                try:
                    with open(f, "rb"):
                        outcome.append(f"{f.name} read")
                except PermissionError:
                    outcome.append(f"{f.name} refused")
            return outcome

        assert run_as("nobody", read_them) == [f"{f.name} refused" for f in files]
    finally:
        node.close()


def plant_state(folder: Path, bait: Path, victim: subprocess.Popen[bytes]) -> None:
    """As the attacker: a config and a paused record in ``folder`` naming root's file as a
    job's control document and a root process as that job."""
    (folder / "state").mkdir(mode=0o755)
    (folder / "arbiter.yaml").write_text(f"state_dir: {folder / 'state'}\n")
    start = float(Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    entry = PausedEntry("evil-1", "control", victim.pid, start, "control_doc", str(bait))
    journal = PausedJournal(folder / "state" / "paused.journal")
    journal.append("pause", entry)
    journal.close()


@needs_root
def test_resume_all_as_root_trusts_no_state_another_account_left(shared_root: Path) -> None:
    """Root runs ``arbiter resume-all`` in a folder ``nobody`` filled: the config there is
    not read; named with ``--config``, its state is refused as not trusted; either way root's
    file is untouched and root's process never signalled."""
    bait = secret_file(shared_root / "secret", "precious")
    theirs = shared_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    victim = subprocess.Popen(["sleep", "300"])
    try:
        run_as("nobody", lambda: plant_state(theirs, bait, victim))
        env = {k: v for k, v in os.environ.items() if k != "ARBITER_CONFIG"}
        env["XDG_CONFIG_HOME"] = str(shared_root / "no-config-here")
        env["XDG_STATE_HOME"] = str(shared_root / "no-state-here")
        plain = subprocess.run(
            [PYTHON, "-I", "-m", "arbiter", "resume-all"],
            cwd=theirs,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert bait.read_text() == "root's own\n", "the config in the working folder was followed"
        assert victim.poll() is None, "root's process was signalled"
        assert "resumed 0 item(s)" in plain.stdout, plain
        named = subprocess.run(
            [PYTHON, "-I", "-m", "arbiter", "resume-all", "--config", str(theirs / "arbiter.yaml")],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert named.returncode != 0 and "not trusted" in named.stderr, named
        assert f"owned by uid {NOBODY}" in named.stderr, named
        assert bait.read_text() == "root's own\n" and mode(bait) == 0o600
        assert victim.poll() is None, "root's process was signalled"
    finally:
        victim.kill()
        victim.wait()


def test_root_never_takes_a_config_from_its_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from arbiter.config.locate import find_config

    (tmp_path / "arbiter.yaml").write_text("state_dir: /tmp/x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARBITER_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    found = find_config()
    if os.geteuid() == 0:
        assert found != Path("arbiter.yaml")
    else:
        assert found == Path("arbiter.yaml")  # an account's own folder is its own business
    assert find_config(tmp_path / "arbiter.yaml") == tmp_path / "arbiter.yaml"
