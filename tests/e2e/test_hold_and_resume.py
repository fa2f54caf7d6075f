"""End to end with real processes: a protected program on the (stand-in) GPU holds jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.signals import other_threads, signal_thread
from arbiter_testing.waiting import wait_until

from .conftest import Procs

RUNNING = {"running", "sleeping", "disk-sleep"}


def protected_cmdline(node: HarnessNode) -> str:
    """What only this test's protected stand-in has in its command line: a rule that matched
    any ``arbiter.demo.protected`` would see the stand-ins of tests running beside it."""
    return f"arbiter.demo.protected --events {node.root / 'p.jsonl'}"


def protect_rule(marker: str) -> dict[str, Any]:
    return {"id": "prot", "priority": 50, "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}}


def start_protected(node: HarnessNode, tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    assert tmp == node.root  # the events file is what protected_cmdline() matches
    return node.spawn([PYTHON, "-m", "arbiter.demo.protected", "--events", str(tmp / "p.jsonl"), *extra])


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ticks(node: HarnessNode) -> int:
    """How many times the daemon has ticked (observed and decided) so far."""
    ticks: int = node.status()["costs"]["ticks"]
    return ticks


def working(tmp: Path) -> bool:
    """Whether the protected stand-in has done a step of work (it logs each one)."""
    events = tmp / "p.jsonl"
    return events.exists() and events.stat().st_size > 0


def explain_json(node: HarnessNode, subject: str) -> dict[str, Any]:
    out = node.cli("explain", subject, "--json", timeout=30, check=True)
    explained: dict[str, Any] = json.loads(out.stdout)
    return explained


def test_plain_job_is_stopped_within_two_ticks_and_resumed_after_release(
    node: HarnessNode, tmp_path: Path, procs: type[Procs]
) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain")
    assert procs.state(pid) in RUNNING
    protected = start_protected(node, tmp_path)
    wait_until(lambda: working(tmp_path), 30, "the protected program's first step")
    # counted in the daemon's ticks, not in seconds: a loaded machine stretches a tick, and
    # the promise is in ticks (two to see it, one under way when it started, one to spare)
    seen_at = ticks(node)
    took = procs.wait(pid, {"stopped"}, timeout=30)
    passed = ticks(node) - seen_at
    print(f"\nprotected working -> job stopped: {took:.2f}s, {passed} tick(s) of {node.config['tick_s']}s")
    assert passed <= 4
    explain = explain_json(node, "plain")
    (item,) = explain["items"]
    assert item["state"] == "paused" and item["via"] == "tree"
    assert item["reasons"][0]["code"] == "PROTECTED_GPU_BUSY" and item["reasons"][0]["evidence"]["rule"] == "prot"
    protected.terminate()
    protected.wait()
    exited = time.monotonic()
    procs.wait(pid, RUNNING, timeout=10)
    waited = time.monotonic() - exited
    print(f"protected exit -> job resumed: {waited:.2f}s (gpu_release_after_s {node.config['gpu_release_after_s']}s)")
    assert waited >= node.config["gpu_release_after_s"] - node.config["tick_s"]
    node.events("JOB_RESUMED", subject=item["id"])
    codes = [e["code"] for e in node.events(subject=item["id"])]
    assert codes.index("JOB_PAUSED") < codes.index("JOB_RESUMED")


def test_cooperative_job_is_paused_through_its_control_document(
    node: HarnessNode, tmp_path: Path, procs: type[Procs]
) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job"], "--cooperative", "--name", "coop")
    pid = node.job_pid("coop")
    control = Path(node.wait_for(lambda: node.call("explain", subject="coop") and node.status()["jobs"][0]["id"]))
    control = node.state_dir / "jobs" / str(control) / "control.json"
    protected = start_protected(node, tmp_path)
    node.wait_for(lambda: json.loads(control.read_text())["state"] == "paused", timeout=10)
    # it reads the document at its next unit's end (20 ms) or on the nudge: by the time the
    # protected program, which works without pause on the same core, has spent 0.3 s, it has
    procs.cpu_beside(pid, protected.pid, 0.3)
    spent, beside = procs.cpu_beside(pid, protected.pid, 1.0)
    print(f"\npaused job: {spent:.3f}s of CPU while the protected program spent {beside:.2f}s")
    assert spent < 0.2 * beside  # it really does no work (running, it would spend about as much)
    assert procs.state(pid) != "stopped"  # it paused itself at a safe point
    assert node.known_job("coop")["via"] == "control"
    protected.terminate()
    node.wait_for(lambda: json.loads(control.read_text())["state"] == "run", timeout=10)
    procs.spends(pid, 0.3)  # and works again


def test_job_submitted_while_protected_works_starts_only_when_admitted(
    node: HarnessNode, tmp_path: Path, procs: type[Procs]
) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    protected = start_protected(node, tmp_path)
    node.wait_for(lambda: node.status()["rules"][0]["using_gpu"])
    marker = tmp_path / "started"
    launcher = node.job_run(
        [PYTHON, "-c", f"open({str(marker)!r}, 'w').close(); raise SystemExit(3)"], "--name", "late"
    )
    node.wait_for(lambda: node.job("late") and node.known_job("late")["state"] == "held")
    held_at = ticks(node)  # two more decisions, each a chance to start it wrongly
    wait_until(lambda: ticks(node) >= held_at + 2, 30, "two more ticks")
    assert not marker.exists()
    assert node.known_job("late")["reasons"][0]["code"] == "PROTECTED_GPU_BUSY"
    protected.terminate()
    assert launcher.wait(timeout=20) == 3  # the command's own exit code
    assert marker.exists()
    node.wait_for(lambda: node.job("late") is None)


def test_bursts_cause_at_most_two_switches(node: HarnessNode, tmp_path: Path, procs: type[Procs]) -> None:
    node.config["gpu_release_after_s"] = 3
    node.write_config()
    node.add_rule("prot", {**protect_rule("burst-standin")})
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    node.job_pid("plain")
    burst = (
        "import time, sys\nend = time.monotonic() + 10\n"
        "while time.monotonic() < end:\n t = time.monotonic()\n while time.monotonic() - t < 1: pass\n time.sleep(1)\n"
    )
    node.spawn([PYTHON, "-c", burst, "burst-standin"]).wait(timeout=60)
    jid = node.known_job("plain")["id"]
    events = [e["code"] for e in node.call("timeline", subject=jid, limit=200)["events"]]
    switches = sum(code in ("JOB_PAUSED", "JOB_RESUMED") for code in events)
    print(f"\n1 s bursts for 10 s: {switches} pause/resume switches")
    assert 1 <= switches <= 2


def test_kill_9_then_start_resumes_the_paused_job(node: HarnessNode, tmp_path: Path, procs: type[Procs]) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain")
    protected = start_protected(node, tmp_path)
    procs.wait(pid, {"stopped"})
    assert node.daemon is not None
    helpers = psutil.Process(node.daemon.pid).children(recursive=True)
    node.kill_daemon()
    protected.terminate()
    # once every process the daemon started has ended, nothing is left that could act for it
    wait_until(lambda: not [p for p in helpers if running(p)], 30, "the killed daemon's own processes to end")
    assert procs.state(pid) == "stopped"  # nobody resumed it yet
    node.start()
    procs.wait(pid, RUNNING, timeout=10)
    assert node.job("plain") is not None  # the new daemon still knows the job
    assert node.events("JOB_RESUMED", contains="left by a previous daemon")


def test_resume_all_after_a_crash(node: HarnessNode, tmp_path: Path, procs: type[Procs]) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain")
    start_protected(node, tmp_path)
    procs.wait(pid, {"stopped"})
    node.kill_daemon()
    out = node.cli("resume-all")
    assert out.returncode == 0, out.stderr
    assert "resumed 1 item" in out.stdout
    procs.wait(pid, RUNNING, timeout=5)


def test_sigterm_resumes_everything_and_exits_cleanly(node: HarnessNode, tmp_path: Path, procs: type[Procs]) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    node.job_run([PYTHON, "-m", "arbiter.demo.job"], "--cooperative", "--name", "coop")
    pid = node.job_pid("plain")
    node.job_pid("coop")
    start_protected(node, tmp_path)
    procs.wait(pid, {"stopped"})
    node.wait_for(lambda: node.known_job("coop")["state"] == "paused")
    coop_id = node.known_job("coop")["id"]
    assert node.stop() == 0
    assert procs.state(pid) in RUNNING
    control = json.loads((node.state_dir / "jobs" / coop_id / "control.json").read_text())
    assert control["state"] == "run"
    assert not (node.state_dir / "daemon.json").exists()


def test_a_stop_signal_taken_by_a_thread_other_than_the_main_one_stops_the_daemon(node: HarnessNode) -> None:
    # The kernel may hand a signal sent to a process to any of its threads; tgkill gives it
    # to another thread, while the main thread waits for the stop without a timeout.
    node.start()
    assert node.daemon is not None
    # the oldest thread but the main one: one started with the daemon, which lives as long
    signal_thread(node.daemon.pid, other_threads(node.daemon.pid)[0], signal.SIGTERM)
    assert node.daemon.wait(15) == 0
    assert not (node.state_dir / "daemon.json").exists()


def test_http_listener_serves_status_and_guards_mutations(node: HarnessNode) -> None:
    import urllib.error
    import urllib.request

    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    url = node.info()["http"]
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url + "/v1/status", timeout=5) as resp:
        assert json.load(resp)["rules"][0]["id"] == "prot"
    with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
        assert resp.read() == b"ok"
    req = urllib.request.Request(url + "/v1/reload", method="POST")
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("a reload without the token was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
    token = (node.state_dir / "token").read_text().strip()
    assert oct(os.stat(node.state_dir / "token").st_mode & 0o777) == "0o600"
    req = urllib.request.Request(url + "/v1/reload", method="POST", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def test_status_and_timeline_cli(node: HarnessNode) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    for args in (["status"], ["timeline"], ["explain"]):
        out = node.cli(*args, timeout=30)
        assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [PYTHON, "-m", "arbiter", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "ARBITER_CONFIG": str(node.config_path)},
        check=True,
    )
    assert json.loads(out.stdout)["gpu_jobs"] == "when_no_gpu_protected"
    out = node.cli("explain", "nothing", timeout=30)
    assert out.returncode == 1 and "known: prot" in out.stderr


def test_no_daemon_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(f"state_dir: {tmp_path / 's'}\n")
    out = subprocess.run(
        [sys.executable, "-m", "arbiter", "status", "--config", str(tmp_path / "a.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 75 and "arbiter run" in out.stderr  # its own status: no daemon


def test_control_documents_stay_ahead_across_a_crash(node: HarnessNode, tmp_path: Path, procs: type[Procs]) -> None:
    node.add_rule("prot", protect_rule(protected_cmdline(node)))
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job"], "--cooperative", "--name", "coop")
    pid = node.job_pid("coop")
    control = node.state_dir / "jobs" / node.known_job("coop")["id"] / "control.json"
    protected = start_protected(node, tmp_path)
    node.wait_for(lambda: json.loads(control.read_text())["state"] == "paused", timeout=10)
    before = json.loads(control.read_text())["seq"]
    node.kill_daemon()
    node.start()  # resumes it (run), then finds the protected program still busy: paused again
    node.wait_for(lambda: json.loads(control.read_text())["seq"] >= before + 2, timeout=10)
    doc = json.loads(control.read_text())
    assert doc["state"] == "paused"
    procs.cpu_beside(pid, protected.pid, 0.3)  # time to read it (see the cooperative test)
    spent, beside = procs.cpu_beside(pid, protected.pid, 1.0)
    assert spent < 0.2 * beside  # the job really obeyed the newer document


def test_start_keeps_on_record_what_a_previous_daemon_left_and_cannot_resume(node: HarnessNode, tmp_path: Path) -> None:
    # a control document in a folder that no longer exists cannot be written: the resume
    # fails, the entry stays on record, and the daemon still starts
    sleeper = node.spawn([PYTHON, "-c", "import time; time.sleep(60)"])
    started = psutil.Process(sleeper.pid).create_time()
    gone = tmp_path / "gone" / "control.json"
    node.state_dir.mkdir(parents=True, exist_ok=True)
    entry = ["left-behind", "control", sleeper.pid, started, "control_file", str(gone)]
    (node.state_dir / "paused.journal").write_text(json.dumps({"op": "pause", "entries": [entry]}) + "\n")
    node.start()
    assert node.events("JOB_RESUMED", contains="left by a previous daemon")
    rows = [json.loads(line) for line in (node.state_dir / "paused.journal").read_text().splitlines()]
    assert [r["entries"][0][:3] for r in rows] == [["left-behind", "control", sleeper.pid]]


DUTY_JOB = """
import sys, time
from arbiter.sdk import Control, Duty, Stopped

ctl = Control()
duty = Duty(ctl)  # units timed by the wall clock, as on a GPU; a stop is seen through SIGCONT
try:
    while True:
        with duty.unit():
            open(sys.argv[1], "a").write(f"{time.monotonic()}\\n")
            time.sleep(1.0)  # the unit's work: 1 s on the device
except Stopped:
    ctl.acknowledge_stop()
"""


def test_a_duty_job_paused_from_outside_mid_unit_is_not_idled_for_the_pause(
    node: HarnessNode, tmp_path: Path, procs: type[Procs]
) -> None:
    # a unit of 1 s at duty 0.2 idles 4 s; a 3 s pause inside one once made it idle 16 s more
    manifest = tmp_path / "duty.yaml"
    manifest.write_text("name: dutyjob\ncapabilities: [cooperative_throttle]\ngpu: {use: shared, max_duty: 0.2}\n")
    units = tmp_path / "units"
    node.start()
    node.job_run([PYTHON, "-c", DUTY_JOB, str(units)], "--manifest", str(manifest))
    pid = node.job_pid("dutyjob")
    job_id = node.known_job("dutyjob")["id"]

    def begun() -> list[float]:
        return [float(x) for x in units.read_text().split()] if units.exists() else []

    wait_until(lambda: len(begun()) >= 2, 30, "the job's second unit to begin")
    first_two = begun()
    node.call("job.pause", id=job_id)  # no cooperative_pause: it is stopped from outside
    procs.wait(pid, {"stopped"}, timeout=10)
    paused_in_unit = time.monotonic() - first_two[-1] < 1.0
    time.sleep(3.0)  # the outside pause under test, not a wait for something
    node.call("job.resume", id=job_id)
    procs.wait(pid, RUNNING, timeout=10)
    resumed = time.monotonic()
    wait_until(lambda: len(begun()) >= 3, 30, "the unit after the pause to begin")
    after = begun()[2] - resumed
    print(f"\npaused {'inside' if paused_in_unit else 'after'} a unit; the next began {after:.2f}s after the resume")
    # what is left of the unit (1 s) and one unit's idle (4 s) at most, not the pause's 12 s more
    assert after < 6.0


def test_a_job_whose_launcher_and_processes_were_killed_ends_though_no_one_waited_for_them(
    node: HarnessNode, procs: type[Procs]
) -> None:
    node.start()
    launcher = node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain")
    launcher.kill()  # not waited for: it stays in the process table as exited until its parent waits
    os.kill(pid, 9)
    procs.wait(launcher.pid, {"zombie"})
    node.wait_for(lambda: node.events("JOB_EXITED", contains="its processes are gone"), timeout=30)
    assert node.job("plain") is None  # no longer among the daemon's jobs
    launcher.wait()


def test_pause_and_resume_take_a_name_as_explain_does_and_say_what_they_did(
    node: HarnessNode, procs: type[Procs]
) -> None:
    node.start()
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "render-batch")
    pid = node.job_pid("render-batch")
    job_id = node.known_job("render-batch")["id"]
    paused = node.cli("job", "pause", "render-batch")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.strip() == f"job {job_id}: held by you until `arbiter job resume`"
    procs.wait(pid, {"stopped"}, timeout=30)
    again = node.cli("job", "pause", "render-batch")
    assert again.stdout.strip() == f"job {job_id}: already held by you"
    resumed = node.cli("job", "resume", "render-batch")
    assert resumed.returncode == 0 and "your hold is lifted" in resumed.stdout, resumed.stderr
    procs.wait(pid, RUNNING, timeout=30)
    unknown = node.cli("job", "pause", "render-btch")
    assert unknown.returncode != 0 and "no running job has id 'render-btch'" in unknown.stderr
