"""One account flooding the daemon (jobs registered in bulk with long command lines,
connections held open and left silent, requests without end) is held to its quotas, and
never delays a pause: the protected program's phase still pauses root's job at once."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from arbiter.api.transport import RequestRefused, request
from arbiter_testing import run_as, wait_until
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule

from .conftest import Background, needs_root

QUOTAS = {"jobs_per_uid": 20, "connections_per_uid": 8, "cmd_bytes": 60_000}


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def register(sock: str, name: str, cmd_bytes: int) -> str:
    try:
        request(sock, "job.register", manifest={"name": name}, cmd=["x" * cmd_bytes])
        return "ok"
    except RequestRefused as exc:
        return exc.code


def hold_connections(sock: str, count: int) -> tuple[list[socket.socket], list[str]]:
    """``count`` connections left silent, and what the daemon said on each at once (if anything)."""
    held, said = [], []
    for _ in range(count):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(sock)
        conn.settimeout(0.5)
        try:
            line = conn.recv(4096)
            said.append(json.loads(line)["code"] if line else "closed")
        except TimeoutError:
            said.append("")  # nothing: the connection waits for a request
        held.append(conn)
    return held, said


@needs_root
def test_one_account_is_held_to_its_quotas(shared_root: Path) -> None:
    node = HarnessNode(shared_root, quotas=QUOTAS)
    node.start()
    try:
        sock = str(node.socket)

        def attack() -> dict[str, Any]:
            jobs = [register(sock, "bulk", 1000) for _ in range(QUOTAS["jobs_per_uid"] + 3)]
            long_cmd = register(sock, "long", QUOTAS["cmd_bytes"] + 1)
            held, said = hold_connections(sock, QUOTAS["connections_per_uid"] + 2)
            for conn in held:
                conn.close()
            return {"jobs": jobs, "long": long_cmd, "said": said}

        outcome = run_as("nobody", attack)
        assert outcome["jobs"] == ["ok"] * QUOTAS["jobs_per_uid"] + ["QUOTA"] * 3
        assert outcome["long"] == "QUOTA"
        assert outcome["said"] == [""] * QUOTAS["connections_per_uid"] + ["QUOTA"] * 2
        # root is bound by no quota but the command line's length, and gets an answer at once
        assert register(sock, "roots", 1000) == "ok"
        assert register(sock, "roots", QUOTAS["cmd_bytes"] + 1) == "QUOTA"
        # what one account's connections held is given back when they close
        assert run_as("nobody", lambda: hold_connections(sock, 1)[1]) == [""]
        timeline = node.call("timeline", limit=10)
        assert timeline["events"] is not None
    finally:
        node.close()


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"t": time.time(), "event": "status", "state": {"phase": value}}) + "\n")


def flood(sock: str, until: Path, seconds: float) -> dict[str, Any]:
    """As the attacker, until the file ``until`` exists (``seconds`` at most): register jobs
    with long command lines, hold every connection it may, and ask for status without pause
    on as many threads."""
    deadline = time.monotonic() + seconds
    codes: dict[str, int] = {}
    lock = threading.Lock()

    def count(code: str) -> None:
        with lock:
            codes[code] = codes.get(code, 0) + 1

    def registrations() -> None:
        while time.monotonic() < deadline and not until.exists():
            count(register(sock, "flood", 50_000))

    def statuses() -> None:
        while time.monotonic() < deadline and not until.exists():
            try:
                request(sock, "status", timeout=5)
                count("status")
            except Exception as exc:
                count(getattr(exc, "code", "") or type(exc).__name__)

    threads = [threading.Thread(target=registrations) for _ in range(2)]
    threads += [threading.Thread(target=statuses) for _ in range(4)]
    # every connection its quota allows: silent ones, and one per thread
    held, _ = hold_connections(sock, QUOTAS["connections_per_uid"] - len(threads))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for conn in held:
        conn.close()
    return codes


@needs_root
@pytest.mark.timeout(180)
def test_a_flood_by_one_account_never_delays_a_pause(shared_root: Path) -> None:
    events = shared_root / "events.jsonl"
    events.touch()
    node = HarnessNode(shared_root, quotas=QUOTAS)
    node.add_rule(
        "p",
        phase_rule("p", "sleep 1029", events, on=["uploading"], field="state.phase"),
    )
    node.start()
    try:
        node.spawn(["sleep", "1029"])
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "roots")
        pid = node.job_pid("roots", timeout=30)
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=30)

        done = shared_root / "done"
        attacker = Background("nobody", lambda: flood(str(node.socket), done, 120.0))
        # the flood is at its height: every job its quota allows is registered
        wait_until(
            lambda: sum(j["name"] == "flood" for j in node.status()["jobs"]) >= QUOTAS["jobs_per_uid"],
            60,
            "the attacker's jobs to fill its quota",
        )
        started = time.monotonic()
        phase(events, "uploading")
        wait_until(lambda: process_state(pid) == "T", 30, "root's job to be paused")
        took = time.monotonic() - started
        status_started = time.monotonic()
        node.status()
        status_took = time.monotonic() - status_started
        done.touch()
        codes = attacker.join()
        print(f"\nunder a flood ({codes}): phase -> pause {1000 * took:.0f} ms, status {1000 * status_took:.0f} ms")
        assert codes.get("QUOTA", 0) > 0 and codes.get("status", 0) > 0, codes
        # without quotas the daemon ran out of descriptors and the job ran on for 10 s and more
        assert took < 5.0, f"the pause took {took:.1f}s under the flood"
        phase(events, "idle")
        wait_until(lambda: process_state(pid) != "T", 30, "root's job to be resumed")
    finally:
        node.close()


@needs_root
@pytest.mark.timeout(240)
def test_any_account_asking_for_the_probes_again_cannot_keep_them_running(shared_root: Path) -> None:
    """The probes run as root, a process each: an account other than an administrator gets
    the last answer while it is under a minute old, however often it asks."""
    node = HarnessNode(shared_root, admin_group="arbiter-no-such-group")
    node.start()
    try:
        sock = str(node.socket)

        def refreshed() -> float:
            return float(request(sock, "gpu-apis", refresh=True, timeout=120)["gpu_apis"]["probed_at"])

        first = run_as("nobody", refreshed)
        assert [run_as("nobody", refreshed) for _ in range(3)] == [first] * 3
        assert refreshed() > first  # root's asking runs them anew
    finally:
        node.close()


@needs_root
def test_short_lived_jobs_in_a_loop_are_held_in_time_and_bytes(shared_root: Path) -> None:
    """``nobody`` registers jobs with 50 KB command lines and ends each at once, in a loop:
    held to a number per minute, each command line stored cut, and the ended jobs' rows and
    folders pruned to the number kept (before, 1,487 folders and 40 MB in 20 s)."""
    quotas = {**QUOTAS, "registrations_per_minute": 5, "ended_jobs_kept": 3}
    node = HarnessNode(shared_root, quotas=quotas)
    node.start()
    try:
        sock = str(node.socket)

        def churn() -> list[str]:
            said = []
            for _ in range(8):
                try:
                    job = request(sock, "job.register", manifest={"name": "churn"}, cmd=["y" * 50_000])["job"]
                    request(sock, "job.exited", id=job["id"], exit_code=0)
                    said.append("ok")
                except RequestRefused as exc:
                    said.append(f"{exc.code} {exc}")
            return said

        said = run_as("nobody", churn)
        assert said[:5] == ["ok"] * 5, said
        assert all(s.startswith("QUOTA") and "registrations_per_minute" in s for s in said[5:]), said
        assert register(sock, "roots", 1000) == "ok"  # root is held to none, and its registration prunes
        folders = [p for p in (node.state_dir / "jobs").iterdir() if p.is_dir()]
        assert len(folders) <= quotas["ended_jobs_kept"] + 1, folders  # the ended ones kept, and root's

        def stored() -> list[int] | None:
            with sqlite3.connect(node.state_dir / "state.db") as db:
                rows = db.execute("SELECT cmd FROM jobs WHERE state = 'ended'").fetchall()
            return [len(row[0]) for row in rows] if 0 < len(rows) <= quotas["ended_jobs_kept"] else None

        sizes = wait_until(stored, 30, "the ended jobs' rows pruned")
        assert max(sizes) < 4200, sizes  # each command line cut to 4096 bytes and a note
    finally:
        node.close()
