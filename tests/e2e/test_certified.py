"""Certified co-tenancy with real processes: a certificate in the store, the protected
stand-in running, a cooperative job gets a duty; the protected program slows on purpose and
the budget halves, then is taken back; `arbiter duty` and `explain` show each step."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.certified import certify, stand_in_cmd, stand_in_rule
from arbiter_testing.node import PYTHON, HarnessNode

ROOT = Path(__file__).resolve().parents[2]


def codes_seen(node: HarnessNode, code: str) -> bool:
    return any(e["code"] == code for e in node.call("timeline", code=code, limit=5)["events"])


def duty(node: HarnessNode) -> dict[str, Any]:
    answer: dict[str, Any] = node.call("duty")["duty"]
    return answer


@pytest.mark.alone
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
        node.add_rule("frames", stand_in_rule(events, max_slowdown=0.05))
        node.start()
        # 50 frames a second on a fixed schedule, late ones made up: only the slow file moves
        # its rate, however busy the machine (its 4 ms of CPU time a frame is its GPU use)
        protected = node.spawn(
            stand_in_cmd(
                events, "--step-s", "0.004", "--frame-s", "0.02", "--catch-up", "--slow-file", str(slow), "--no-pin"
            )
        )
        node.wait_for(lambda: node.status()["rules"][0]["running"])
        certify(node, protected.pid, "frames", 0.5)

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
        node.add_rule("frames", stand_in_rule(events))
        node.start()
        node.spawn(stand_in_cmd(events, "--step-s", "0.01", "--no-pin"))
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


def test_a_name_caught_over_its_duty_waits_and_explain_says_distrust_first(tmp_path: Path) -> None:
    events = tmp_path / "progress.jsonl"
    manifest = tmp_path / "batch.yaml"
    manifest.write_text("name: batch\ncapabilities: [cooperative_throttle]\ngpu: {use: shared}\n")
    node = HarnessNode(
        tmp_path,
        gpu_jobs="certified",
        tick_s=0.25,
        stop_grace_s=1,
        governor={"period_s": 1, "baseline_s": 1, "rebaseline_s": 600, "take_back_s": 3, "grow_step": 0.05},
        # a spinner at duty 0.1 reads over 0.2 beside as many as nine other busy processes
        compliance={"sample_s": 0.5, "pause_s": 1, "over_samples": 2, "strikes_to_stop": 1, "untrusted_s": 600},
    )
    try:
        # the budget stays at the certificate's duty: no slowdown of the stand-in halves it
        node.add_rule("frames", stand_in_rule(events, max_slowdown=0.9))
        node.start()
        protected = node.spawn(stand_in_cmd(events, "--step-s", "0.01", "--no-pin"))
        node.wait_for(lambda: node.status()["rules"][0]["using_gpu"])
        certify(node, protected.pid, "frames", 0.1)

        # a job that says it holds its duty and spins flat out: given 0.1, it is caught and stopped
        cheater = node.job_run([PYTHON, "-c", "while True: pass"], "--manifest", str(manifest))
        try:
            cheater.wait(timeout=40)
        except subprocess.TimeoutExpired:
            print(json.dumps(node.call("explain", subject="batch")["explain"]["items"][0], indent=1)[:3000])
            print(json.dumps(duty(node))[:3000])
            for e in node.call("timeline", limit=60)["events"]:
                print(e["code"], e["message"])
            raise
        node.events("JOB_UNTRUSTED")

        # its next run waits: for its name's distrust first, then for the program it may not run beside
        again = node.job_run([PYTHON, "-c", "pass"], "--manifest", str(manifest))
        node.wait_for(lambda: (j := node.job("batch")) and j["state"] == "held" and len(j["reasons"]) >= 2, timeout=30)
        item = node.call("explain", subject="batch")["explain"]["items"][0]
        print("\n" + "\n".join(f"{r['code']}: {r['message']} -> {r['remedy']}" for r in item["reasons"]))
        distrust, busy = item["reasons"][:2]
        assert distrust["code"] == "JOB_UNTRUSTED" and busy["code"] == "PROTECTED_GPU_BUSY"
        assert "instead of running under the budget" in distrust["message"]
        assert "trusted again in 10 min" in distrust["remedy"]
        assert "under the budget" not in busy["remedy"]  # the budget is no way out for this name
        assert again.poll() is None
        out = subprocess.run(
            [PYTHON, "-m", "arbiter", "explain", "--config", str(node.config_path), "batch"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "COLUMNS": "200"},
        ).stdout
        assert out.index("JOB_UNTRUSTED") < out.index("PROTECTED_GPU_BUSY"), out
    finally:
        node.close()
