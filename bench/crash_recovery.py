"""Does a daemon killed with SIGKILL at any moment leave the node as it should be?

    uv run python bench/crash_recovery.py [--kills 200] [--seed 1] [--max-wait 4]

A node with a protected stand-in (``arbiter.demo.protected``) whose JSONL file carries its
frames and a phase that a writer flips on a random schedule, so cpu jobs are paused and
resumed all the time: a plain job (SIGSTOP) and an SDK-cooperative one (its control
document).  The same rule has a GPU profile (``fake_profile``: a JSON "device"), and a
paired ON/OFF run with 1 s windows records blocks against it with a cooperative gpu job.
Certificates are inserted through the store API, a job name carries strikes and distrust,
and now and then a job is started and asked to stop.

Then, ``--kills`` times: wait a random moment (seeded), SIGKILL the daemon, look at its
SQLite file read-only from outside (``PRAGMA integrity_check``, the timeline never shrinks,
the profile's saved settings are the device's true ones), restart it and, after its first
decision, check that no process is left SIGSTOPped (or a control document left paused)
unless the new daemon says it is paused now, that the certificates are byte for byte the
same, that strikes and distrust are kept, that the profile is applied again, and that the
A/B run goes on with every committed block.  Prints counts per check and totals; exits 1 on
any violation.

One file past 400 lines: a bench script is run by its path, and the node it kills sits beside
the invariants it checks after each kill.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from arbiter.state.certificates import Certificate
from arbiter.state.store import Store
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule

ROOT = Path(__file__).resolve().parents[1]
RULE = "frames"
PHASED = "uplink"
ORIGINAL_W, PROFILE_W = 300, 200
SETTLE_S = 3.0  # how long a state that looks wrong may last before it counts (the daemon may be acting on it)
CHECKS = (
    "integrity",
    "timeline",
    "profile_at_kill",
    "stopped",
    "control_doc",
    "certificates",
    "trust",
    "profile_reapplied",
    "ab_resumed",
    "stops_honoured",
)

COOP = """\
import time
from arbiter.sdk import Control, Stopped
ctl = Control()
try:
    while True:
        ctl.safe_point()
        ctl.wait(0.05)
except Stopped:
    raise SystemExit(ctl.acknowledge_stop())
"""
IDLE = "import time\nwhile True: time.sleep(0.05)"
STAND_IN = "import sys\nfrom arbiter.demo import protected as stand_in\nstand_in.main(sys.argv[1:])"


@dataclass
class Tally:
    passed: Counter[str] = field(default_factory=Counter)
    violated: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, why: str = "") -> bool:
        (self.passed if ok else self.violated)[name] += 1
        if not ok:
            self.notes.append(f"{name}: {why}")
            print(f"  VIOLATION {name}: {why}", flush=True)
        return ok


# --- the database, read from outside ---------------------------------------------------------


def read_only(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    return conn


@dataclass(frozen=True)
class OnDisk:
    integrity: str
    timeline_rows: int
    timeline_max_id: int
    certificates: dict[int, str]  # id -> SHA-256 of the row
    trust: dict[str, dict[str, Any]]
    profile_saved: dict[str, Any] | None
    run: dict[str, Any] | None
    controls: dict[str, str]  # job name -> control document path, for jobs that run


def on_disk(db: Path, run_id: str | None) -> OnDisk:
    conn = read_only(db)
    try:
        integrity = "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check").fetchall())
        rows, max_id = conn.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM timeline").fetchone()
        certs = {
            r["id"]: hashlib.sha256(json.dumps(dict(r), sort_keys=True).encode()).hexdigest()
            for r in conn.execute("SELECT * FROM certificates ORDER BY id")
        }
        trust = {r["name"]: json.loads(r["record"]) for r in conn.execute("SELECT name, record FROM trust")}
        prof = conn.execute("SELECT saved FROM profiles WHERE rule = ?", (RULE,)).fetchone()
        run = None
        if run_id:
            found = conn.execute("SELECT record FROM ab_runs WHERE id = ?", (run_id,)).fetchone()
            run = json.loads(found["record"]) if found else None
        controls = {
            r["name"]: r["control_path"]
            for r in conn.execute("SELECT name, control_path FROM jobs WHERE state != 'ended'")
        }
    finally:
        conn.close()
    return OnDisk(integrity, rows, max_id, certs, trust, json.loads(prof["saved"]) if prof else None, run, controls)


def power(card: Path) -> int:
    return int(json.loads(card.read_text())["power_limit_w"])


def trust_same(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> str:
    """'' when every name's strikes and distrust are kept (wall times survive the monotonic
    round trip to well within a second)."""
    for name, rec in before.items():
        got = after.get(name)
        if got is None:
            return f"{name!r} lost its record"
        if len(got.get("strikes", [])) != len(rec.get("strikes", [])):
            return f"{name!r} had {len(rec['strikes'])} strikes, now {len(got.get('strikes', []))}"
        if any(abs(a - b) > 1.0 for a, b in zip(sorted(got["strikes"]), sorted(rec["strikes"]), strict=True)):
            return f"{name!r}'s strike times moved: {rec['strikes']} -> {got['strikes']}"
        was, now = rec.get("untrusted_until"), got.get("untrusted_until")
        if (was is None) != (now is None) or (was is not None and abs(was - now) > 1.0):
            return f"{name!r}'s distrust changed: {was} -> {now}"
    return ""


# --- the node ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, root: Path, rng: random.Random, tick_s: float) -> None:
        self.root = root
        self.rng = rng
        self.events = root / "frames.jsonl"
        self.events.touch()
        self.phases = root / "uplink.jsonl"
        self.phases.touch()
        self.card = root / "device.json"
        self.card.write_text(json.dumps({"power_limit_w": ORIGINAL_W}))
        self.node = HarnessNode(
            root,
            tick_s=tick_s,
            gpu_jobs="certified",
            gpu_release_after_s=600,
            stop_grace_s=1,
            compliance={"sample_s": 0.5},
            governor={"period_s": 2, "baseline_s": 2, "rebaseline_s": 600, "take_back_s": 3, "grow_step": 0.05},
        )
        self.db = self.node.state_dir / "state.db"
        self.run_id: str | None = None
        self.flips = 0
        self.runs_ended = 0
        self.doomed: dict[str, tuple[subprocess.Popen[bytes], float | None]] = {}  # name -> (launcher, stop asked at)
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None

    def setup(self, certificates: int) -> None:
        n = self.node
        n.add_rule(
            RULE,
            {
                "id": RULE,
                "match": {"cmdline": [str(self.events)]},
                "immediate": True,
                "protect": {
                    "source": {"kind": "jsonl", "path": str(self.events), "event": "step_done"},
                    "max_slowdown": 0.05,
                },
                "profile": {"kind": "fake_profile", "device_file": str(self.card), "power_limit_w": PROFILE_W},
            },
        )
        # the phases on a rule of their own: a phase change on the run's rule leaves its block out
        n.add_rule(
            PHASED,
            phase_rule(PHASED, "sleep 1031", self.phases, on=["uploading"], field="state.phase", scope="cpu"),
        )
        store = Store(self.db)
        try:
            for i in range(certificates - 1):
                store.add_certificate(self._certificate(i))
            now = time.time()
            # a name stopped for its duty, and one with a strike: each its owner's (the bench's user)
            owner = os.geteuid()
            with store.transaction() as db:
                Store.put_trust(
                    db,
                    {
                        f"{owner}:greedy": {
                            "strikes": [now - 300, now - 200, now - 100],
                            "untrusted_until": now + 3 * 3600,
                        },
                        f"{owner}:careful": {"strikes": [now - 50], "untrusted_until": None},
                    },
                )
        finally:
            store.close()
        n.start()
        # started so that its command line does not say arbiter.demo.protected: the box is shared,
        # and other nodes' rules look for that name (this node's rule looks for its file)
        n.spawn([PYTHON, "-c", STAND_IN, "--events", str(self.events), "--step-s", "0.004", "--gap-s", "0.006"])
        n.spawn(["sleep", "1031"])
        n.wait_for(lambda: all(r["running"] for r in n.status()["rules"]), timeout=30)
        n.wait_for(lambda: n.known_rule(RULE)["sources"][0]["rate"], timeout=30)
        none = self.root / "cpu-job.yaml"
        none.write_text("name: cpu-job\ngpu: {use: none}\n")
        coop = self.root / "coop.yaml"
        coop.write_text("name: coop\ncapabilities: [cooperative_pause, cancellable]\ngpu: {use: none}\n")
        gpu = self.root / "llmbatch.yaml"
        gpu.write_text(
            "name: llmbatch\ncapabilities: [cooperative_throttle, cooperative_pause, cancellable]\ngpu: {use: shared}\n"
        )
        greedy = self.root / "greedy.yaml"
        greedy.write_text("name: greedy\ncapabilities: [cooperative_throttle]\ngpu: {use: shared, max_duty: 0.3}\n")
        quiet = {"stderr": subprocess.DEVNULL}
        n.job_run([PYTHON, "-c", IDLE], "--manifest", str(none), "--name", "plain", **quiet)
        n.job_run([PYTHON, "-c", COOP], "--manifest", str(coop), **quiet)
        n.job_run(
            [PYTHON, "-m", "llmbatch", "run", "--repeat", "0", "--steps", "4", "--width", "60", "--out", "/dev/null"],
            "--manifest",
            str(gpu),
            cwd=ROOT / "examples" / "llmbatch",
            **quiet,
        )
        n.job_run([PYTHON, "-c", "pass"], "--manifest", str(greedy), **quiet)  # held: its name is not trusted
        n.wait_for(
            lambda: {"plain", "coop", "llmbatch", "greedy"} <= {j["name"] for j in n.status()["jobs"]}, timeout=30
        )
        n.wait_for(lambda: all(j["pids"] for j in n.status()["jobs"] if j["name"] in ("plain", "coop")), timeout=30)
        self.start_run()
        store = Store(self.db)  # one more while the daemon runs: it shares the file
        try:
            store.add_certificate(self._certificate(certificates))
        finally:
            store.close()
        self._writer = threading.Thread(target=self._flip_phases, daemon=True)
        self._writer.start()

    def _certificate(self, i: int) -> Certificate:
        return Certificate(
            rule=RULE,
            work="cpu",
            duty=round(0.1 + 0.05 * i, 2),
            r=0.995,
            r_low=0.97,
            r_high=1.02,
            margin=0.05,
            run_id=f"bench-{i}",
            issued_at=time.time() - 3600,
            node="bench",
            fingerprint={"cpu": "bench", "gpus": [], "os": "bench", "arbiter": "0"},
            exe_path="/nonexistent/bench",
            exe_sha256="0" * 64,
        )

    def start_run(self) -> None:
        """A run that will not end by itself: 10,000 blocks of two 1 s windows."""
        self.node.call(
            "ab.start", rule=RULE, duty=0.1, window=1, washout=0.2, blocks=10_000, margin=0.5, max_hours=24 * 14
        )
        self.run_id = self.node.call("ab.status")["runs"][0]["run"]

    def _flip_phases(self) -> None:
        rng = random.Random(self.rng.random())
        on = False
        while not self._stop.wait(rng.uniform(0.2, 1.2)):
            on = not on
            with open(self.phases, "a") as fh:
                fh.write(json.dumps({"event": "status", "state": {"phase": "uploading" if on else "idle"}}) + "\n")
            self.flips += 1

    def churn(self, wait_s: float) -> None:
        """The random wait before a kill, with a job started or asked to stop in it now and then."""
        deadline = time.monotonic() + wait_s
        if self.rng.random() < 0.3 and len(self.doomed) < 4:
            name = f"doomed-{len(self.doomed)}"
            launcher = self.node.job_run(
                [PYTHON, "-c", IDLE],
                "--manifest",
                str(self.root / "cpu-job.yaml"),
                "--name",
                name,
                stderr=subprocess.DEVNULL,
            )
            self.doomed[name] = (launcher, None)
        asked = [name for name, (_, at) in self.doomed.items() if at is None]
        if asked and self.rng.random() < 0.5:
            time.sleep(self.rng.uniform(0, max(0.0, deadline - time.monotonic())))
            name = self.rng.choice(asked)
            job = next((j for j in self.node.status()["jobs"] if j["name"] == name), None)
            if job is not None:
                self.node.call("job.stop", id=job["id"])
                self.doomed[name] = (self.doomed[name][0], time.monotonic())
        time.sleep(max(0.0, deadline - time.monotonic()))

    def processes(self) -> list[psutil.Process]:
        out = []
        for child in self.node.children:
            try:
                proc = psutil.Process(child.pid)
                out += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return out

    def close(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.join(5)
        self.node.close()


# --- the checks after a restart --------------------------------------------------------------


def settled(check: Any, timeout: float = SETTLE_S) -> str:
    """'' once ``check()`` returns ''; else its last complaint after ``timeout``."""
    deadline = time.monotonic() + timeout
    why = check()
    while why and time.monotonic() < deadline:
        time.sleep(0.1)
        why = check()
    return str(why)


def frozen_wrongly(b: Bench) -> str:
    """A process SIGSTOPped that the daemon says should run (status read after the process
    table, so a pause just made is seen as such)."""
    stopped = {p.pid for p in b.processes() if _status(p) == psutil.STATUS_STOPPED}
    if not stopped:
        return ""
    jobs = b.node.status()["jobs"]
    paused = {pid for j in jobs if j["state"] == "paused" for pid in j["pids"]}
    wrong = sorted(pid for pid in stopped if pid not in paused)
    return f"pids {wrong} are stopped; the daemon says they should run" if wrong else ""


def _status(p: psutil.Process) -> str:
    try:
        return str(p.status())
    except psutil.NoSuchProcess:
        return "gone"


def control_wrongly_paused(b: Bench, controls: dict[str, str]) -> str:
    jobs = {j["name"]: j for j in b.node.status()["jobs"]}
    job = jobs.get("coop")
    path = controls.get("coop")
    if job is None or path is None or job["state"] == "paused":
        return ""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ""  # not written yet
    return (
        f"coop's control document says {doc.get('state')!r} while the daemon says {job['state']!r}"
        if doc.get("state") == "paused"
        else ""
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-wait", type=float, default=4.0, help="the longest wait before a kill, in seconds")
    parser.add_argument("--tick", type=float, default=0.25, help="the daemon's tick_s")
    parser.add_argument("--certificates", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the node's folder")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="arbiter-bench-crash-"))
    b = Bench(root, rng, args.tick)
    t = Tally()
    started = time.monotonic()
    restart_s: list[float] = []
    blocks_seen = 0
    left_stopped = left_applied = 0  # kills that left a process SIGSTOPped, or the profile applied
    try:
        b.setup(args.certificates)
        n = b.node
        before = on_disk(b.db, b.run_id)
        known_certs = dict(before.certificates)
        trust0 = before.trust
        timeline = (0, 0)
        for kill in range(1, args.kills + 1):
            # a third of the kills land in the first half second: restores, resumes, re-applies
            b.churn(rng.uniform(0.0, 0.5) if rng.random() < 0.33 else rng.uniform(0.5, args.max_wait))
            n.kill_daemon()
            disk = on_disk(b.db, b.run_id)
            t.check("integrity", disk.integrity == "ok", f"kill {kill}: integrity_check says {disk.integrity}")
            t.check(
                "timeline",
                disk.timeline_rows >= timeline[0] and disk.timeline_max_id >= timeline[1],
                f"kill {kill}: {disk.timeline_rows} rows (max id {disk.timeline_max_id}), "
                f"had {timeline[0]} (max id {timeline[1]})",
            )
            timeline = (disk.timeline_rows, disk.timeline_max_id)
            w = power(b.card)
            saved = None if disk.profile_saved is None else disk.profile_saved.get("power_limit_w")
            t.check(
                "profile_at_kill",
                (saved in (None, ORIGINAL_W)) and (w == ORIGINAL_W or saved == ORIGINAL_W),
                f"kill {kill}: the device is at {w} W, the record keeps {saved}",
            )
            run_before = disk.run
            left_stopped += any(_status(p) == psutil.STATUS_STOPPED for p in b.processes())
            left_applied += w == PROFILE_W

            t0 = time.monotonic()
            n.start()
            n.wait_for(lambda: n.status()["decided_at"] > 0, timeout=30)
            restart_s.append(time.monotonic() - t0)
            t.check("stopped", not (why := settled(lambda: frozen_wrongly(b))), f"kill {kill}: {why}")
            t.check(
                "control_doc",
                not (why := settled(lambda disk=disk: control_wrongly_paused(b, disk.controls))),
                f"kill {kill}: {why}",
            )
            after = on_disk(b.db, b.run_id)
            lost = {i for i in known_certs if i not in after.certificates}
            changed = {i for i in known_certs if i in after.certificates and after.certificates[i] != known_certs[i]}
            t.check(
                "certificates", not lost and not changed, f"kill {kill}: lost {sorted(lost)}, changed {sorted(changed)}"
            )
            known_certs.update(after.certificates)
            held = settled(
                lambda: (
                    ""
                    if any(
                        r["code"] == "JOB_UNTRUSTED"
                        for j in n.status()["jobs"]
                        if j["name"] == "greedy"
                        for r in j["reasons"]
                    )
                    else "greedy is not held as untrusted"
                )
            )
            t.check("trust", not (why := trust_same(trust0, after.trust) or held), f"kill {kill}: {why}")
            t.check(
                "profile_reapplied",
                not (
                    why := settled(
                        lambda: (
                            ""
                            if power(b.card) == PROFILE_W and n.known_rule(RULE)["profile_applied"]
                            else f"the device is at {power(b.card)} W"
                        ),
                        timeout=15,
                    )
                ),
                f"kill {kill}: {why}",
            )
            if run_before is not None and run_before["status"] == "running":
                runs = {r["run"]: r for r in n.call("ab.status")["runs"]}
                now = runs.get(b.run_id or "")
                kept = len(run_before.get("blocks") or ())
                ok = now is not None and now["status"] == "running" and now["blocks_done"] >= kept
                t.check("ab_resumed", ok, f"kill {kill}: run {b.run_id} had {kept} blocks committed, now {now}")
                blocks_seen = max(blocks_seen, now["blocks_done"] if now else 0)
            elif run_before is not None:  # it ended by its own rules before this kill: a new one
                b.runs_ended += 1
                print(
                    f"  run {b.run_id} ended ({run_before['status']}: {run_before.get('why', '')}); starting another",
                    flush=True,
                )
                b.start_run()
            if kill % 10 == 0 or kill == args.kills:
                print(
                    f"kill {kill}/{args.kills}: {sum(t.violated.values())} violations so far, "
                    f"{blocks_seen} blocks in the run, {b.flips} phase flips, {time.monotonic() - started:.0f}s",
                    flush=True,
                )

        # every job asked to stop has ended (the daemon stops it even across restarts)
        deadline = time.monotonic() + 30
        for name, (launcher, at) in b.doomed.items():
            if at is None:
                continue
            while launcher.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            t.check("stops_honoured", launcher.poll() is not None, f"{name} was asked to stop and still runs")
        asked = sum(1 for _, at in b.doomed.values() if at is not None)
    finally:
        b.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    total_pass, total_bad = sum(t.passed.values()), sum(t.violated.values())
    print(
        f"\n{args.kills} SIGKILLs (seed {args.seed}) in {time.monotonic() - started:.0f}s; "
        f"restart to first decision p50 {sorted(restart_s)[len(restart_s) // 2]:.2f}s, max {max(restart_s):.2f}s"
    )
    print(
        f"phase flips written: {b.flips}; blocks recorded by the A/B run: {blocks_seen}; runs that ended on their own: "
        f"{b.runs_ended}; jobs asked to stop: {asked}"
    )
    print(f"kills that left a process SIGSTOPped: {left_stopped}; that left the profile applied: {left_applied}")
    print(f"{'check':<20}{'passed':>8}{'violated':>10}")
    for name in CHECKS:
        print(f"{name:<20}{t.passed[name]:>8}{t.violated[name]:>10}")
    print(f"{'total':<20}{total_pass:>8}{total_bad:>10}")
    for note in t.notes[:20]:
        print(f"  {note}")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
