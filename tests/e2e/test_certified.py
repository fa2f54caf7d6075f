"""Certified co-tenancy with real processes: a certificate in the store, the protected
stand-in running, a cooperative job gets a duty; the protected program slows on purpose and
the budget halves, then is taken back; `arbiter duty` and `explain` show each step."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil

from arbiter.certificates import Certificate, ExeHasher
from arbiter.store import Store
from arbiter_testing.node import PYTHON, HarnessNode

ROOT = Path(__file__).resolve().parents[2]


def codes_seen(node: HarnessNode, code: str) -> bool:
    return any(e["code"] == code for e in node.call("timeline", code=code, limit=5)["events"])


def duty(node: HarnessNode) -> dict:
    return node.call("duty")["duty"]


def test_a_certified_job_runs_under_the_budget_which_halves_then_is_taken_back(tmp_path: Path) -> None:
    events = tmp_path / "progress.jsonl"
    slow = tmp_path / "slow"
    manifest = tmp_path / "llmbatch.yaml"
    manifest.write_text("name: llmbatch\ncapabilities: [cooperative_throttle, cooperative_pause]\ngpu: {use: shared}\n")
    node = HarnessNode(
        tmp_path,
        gpu_jobs="certified",
        tick_s=0.25,
        gpu_release_after_s=5,
        governor={"period_s": 2, "baseline_s": 2, "rebaseline_s": 600, "take_back_s": 3, "grow_step": 0.05},
    )
    try:
        node.add_rule(
            "frames",
            {
                "id": "frames",
                "match": {"cmdline": [f"arbiter.demo.protected --events {events}"]},  # this test's stand-in alone
                "protect": {
                    "source": {"kind": "jsonl", "path": str(events), "event": "step_done"},
                    "max_slowdown": 0.05,
                },
            },
        )
        node.start()
        # frames on a fixed schedule, late ones made up (as in the A/B harness tests): only the
        # slow file moves its rate, not what other work on a busy machine takes of its core
        protected = node.spawn(
            [
                PYTHON,
                "-m",
                "arbiter.demo.protected",
                "--events",
                str(events),
                "--frame-s",
                "0.01",
                "--catch-up",
                "--step-s",
                "0.002",
                "--slow-file",
                str(slow),
                "--no-pin",
            ]
        )
        node.wait_for(lambda: node.status()["rules"][0]["running"])
        exe = psutil.Process(protected.pid).exe()
        fingerprint = node.call("certificates")["node"]
        store = Store(node.state_dir / "state.db")
        store.add_certificate(
            Certificate(
                rule="frames",
                work="gpu",
                duty=0.5,
                r=0.995,
                r_low=0.985,
                r_high=1.004,
                margin=0.02,
                run_id="test",
                issued_at=time.time(),
                node="here",
                fingerprint=fingerprint,
                exe_path=exe,
                exe_sha256=ExeHasher().digest(exe) or "",
            )
        )
        store.close()
        node.wait_for(lambda: node.call("certificates")["certificates"][0]["status"] == "valid")

        node.job_run(
            [PYTHON, "-m", "llmbatch", "run", "--repeat", "0", "--out", "/dev/null"],
            "--manifest",
            str(manifest),
            cwd=ROOT / "examples" / "llmbatch",
            stderr=subprocess.DEVNULL,
        )
        node.wait_for(lambda: duty(node)["rules"] and duty(node)["rules"][0]["state"] == "baseline", timeout=20)
        running = node.wait_for(
            lambda: (
                (d := duty(node))["rules"][0]["state"] == "running" and d["jobs"] and d["jobs"][0]["asked"] > 0 and d
            ),
            timeout=20,
        )
        print("\n" + running["summary"])
        assert running["ceiling"] == 0.5 and running["jobs"][0]["asked"] == running["budget"] <= 0.5
        assert running["summary"].startswith("budget 0.50 of ceiling 0.50 (running) beside frames; 1 job at 0.50")

        slow.write_text("0.075")  # 7 % slower: at the target, under twice it
        halved = node.wait_for(lambda: codes_seen(node, "GPU_DUTY_HALVE") and duty(node), timeout=30)
        assert halved["budget"] < 0.5
        print(halved["summary"])
        slow.write_text("1.0")  # half its speed: taken back
        taken = node.wait_for(lambda: (d := duty(node))["rules"][0]["state"] == "taken back" and d, timeout=30)
        print(taken["summary"])
        assert taken["budget"] == 0.0 and taken["jobs"][0]["state"] == "held"
        job = node.call("explain", subject="llmbatch")["explain"]["items"][0]
        assert job["reasons"][0]["code"] == "GPU_DUTY_TAKE_BACK"
        slow.write_text("0")
        back = node.wait_for(
            lambda: (d := duty(node))["rules"][0]["state"] == "running" and d["budget"] > 0 and d, timeout=30
        )
        print(back["summary"])
        codes = [e["code"] for e in node.call("timeline", limit=500)["events"]]
        for code in ("GPU_DUTY_BASELINE", "GPU_DUTY_START", "GPU_DUTY_HALVE", "GPU_DUTY_TAKE_BACK"):
            assert code in codes
        assert json.loads(json.dumps(back))  # the JSON form is what --json prints
    finally:
        node.close()


def test_without_a_certificate_certified_behaves_as_the_default(tmp_path: Path) -> None:
    events = tmp_path / "progress.jsonl"
    node = HarnessNode(tmp_path, gpu_jobs="certified")
    try:
        node.add_rule(
            "frames",
            {
                "id": "frames",
                "match": {"cmdline": [f"arbiter.demo.protected --events {events}"]},  # this test's stand-in alone
                "protect": {"source": {"kind": "jsonl", "path": str(events), "event": "step_done"}},
            },
        )
        node.start()
        node.spawn([PYTHON, "-m", "arbiter.demo.protected", "--events", str(events), "--step-s", "0.01", "--no-pin"])
        node.wait_for(lambda: node.status()["rules"][0]["using_gpu"])  # else the job may start and end first
        manifest = tmp_path / "m.yaml"
        manifest.write_text("name: coop\ncapabilities: [cooperative_throttle]\n")
        node.job_run([PYTHON, "-c", "pass"], "--manifest", str(manifest))
        reasons = node.wait_for(lambda: (j := node.job("coop")) and len(j["reasons"]) >= 2 and j["reasons"])
        assert [r["code"] for r in reasons][:2] == ["PROTECTED_GPU_BUSY", "GPU_NOT_CERTIFIED"]
        assert reasons[1]["remedy"] == "arbiter ab sweep --rule frames"
        assert "no governor runs" in duty(node)["summary"]
    finally:
        node.close()
