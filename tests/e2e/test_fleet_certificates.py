"""Certificates shared with twins, end to end on real daemons sharing one folder: one node
earns a certificate with a paired run and publishes it; a twin confirms it with a short run of
its own, adopts it and runs certified work under it; a node whose protected program differs
refuses it and says so.

The three daemons run on this one machine, so their CPU, GPUs, OS and arbiter match, as twins'
do; the third node's program is a copy of the interpreter with one byte added (another
program, another SHA-256).  The work slows the stand-ins by a known amount
(``slowing_job.py``), as in the paired-run tests, so the verdicts do not hang on the box's
own noise."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from arbiter.state import fleetcerts as files
from arbiter_testing.node import PYTHON, HarnessNode

pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]
SLOWING_JOB = Path(__file__).with_name("slowing_job.py")
#: windows short enough for a test, long enough to hold whole frames and duty samples
RUN = ["--yes", "--window", "1.5", "--washout", "0.5", "--blocks", "8", "--max-hours", "0.05", "--margin", "0.1"]
FLEET = {"scan_every_s": 0.5, "window_s": 1.5, "washout_s": 0.5, "max_hours": 0.05}


def fleet_node(tmp_path: Path, name: str, shared: Path, keys: dict[str, str]) -> tuple[HarnessNode, Path]:
    """A node whose signing key is made here, so that every node's list of trusted keys is
    known before any starts."""
    root = tmp_path / name
    state = root / "state"
    state.mkdir(parents=True, mode=0o700)
    key_text = files.new_key_text()
    fd = os.open(state / "signing.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, key_text.encode())
    os.close(fd)
    keys[name] = files.public_text(files.load_key(key_text))
    events = root / "progress.jsonl"
    node = HarnessNode(
        root,
        gpu_jobs="certified",
        tick_s=0.25,
        gpu_release_after_s=600,
        compliance={"sample_s": 0.5},
        governor={"period_s": 2, "baseline_s": 2, "rebaseline_s": 600, "take_back_s": 3, "grow_step": 0.05},
        fleet_certificates={"folder": str(shared), "node_name": name, "trusted_keys": keys, **FLEET},
    )
    node.add_rule(
        "frames",
        {
            "id": "frames",
            "match": {"cmdline": [f"arbiter.demo.protected --events {events}"]},
            "protect": {"source": {"kind": "jsonl", "path": str(events), "event": "step_done"}, "max_slowdown": 0.05},
        },
    )
    return node, events


def start_protected(node: HarnessNode, events: Path, python: str = PYTHON) -> None:
    slow = node.root / "slow"
    node.spawn(
        [
            python,
            "-m",
            "arbiter.demo.protected",
            "--events",
            str(events),
            "--step-s",
            "0.002",
            "--gap-s",
            "0.006",
            "--no-pin",
            "--frame-s",
            "0.01",
            "--catch-up",
            "--slow-file",
            str(slow),
            "--slow-fresh-s",
            "0.25",
        ],
        env={**node.env(), "PYTHONPATH": str(ROOT)},
    )
    node.wait_for(lambda: node.status()["rules"][0]["running"])
    node.wait_for(lambda: node.status()["rules"][0]["sources"][0]["rate"])


def start_job(node: HarnessNode) -> None:
    manifest = node.root / "llmbatch.yaml"
    manifest.write_text(
        "name: llmbatch\ncapabilities: [cooperative_throttle, cooperative_pause, cancellable]\ngpu: {use: shared}\n"
    )
    node.job_run([PYTHON, str(SLOWING_JOB), str(node.root / "slow"), "1.0"], "--manifest", str(manifest))
    node.wait_for(lambda: node.job("llmbatch"))


def event(node: HarnessNode, code: str, timeout: float = 60) -> dict[str, Any]:
    """The newest timeline entry with ``code``, once there is one."""
    found = node.wait_for(lambda: node.call("timeline", code=code, limit=5)["events"], timeout=timeout)
    return max(found, key=lambda e: e["t"])


def fleet_files(node: HarnessNode) -> dict[str, dict[str, Any]]:
    fleet = node.call("certificates")["fleet"]
    return {f["file"]: f for f in fleet["files"]}


def test_a_twin_confirms_and_adopts_a_certificate_and_another_program_refuses_it(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    keys: dict[str, str] = {}
    earner, earner_events = fleet_node(tmp_path, "gpu-a", shared, keys)
    twin, twin_events = fleet_node(tmp_path, "gpu-b", shared, keys)
    other, other_events = fleet_node(tmp_path, "gpu-c", shared, keys)
    nodes = (earner, twin, other)
    try:
        for node in nodes:
            node.config["fleet_certificates"]["trusted_keys"] = keys
            node.write_config()
            node.start()
        assert earner.call("certificates")["fleet"]["public_key"] == keys["gpu-a"]
        # one node's programs run at a time: on a small shared box, three stand-ins and their
        # work at once would slow each other more than the work under test does
        start_protected(earner, earner_events)
        start_job(earner)
        earned = earner.cli("ab", "start", "--rule", "frames", "--duty", "0.1", *RUN, "--follow", timeout=600)
        assert earned.returncode == 0, earned.stdout[-3000:] + earned.stderr
        published = event(earner, "FLEET_CERT_PUBLISHED")
        first_cert_at = published["t"]
        name = "gpu-a.frames.gpu.cert.json"
        assert (shared / name).exists()
        for proc in earner.children:
            proc.terminate()
            proc.wait(30)

        # the node whose program differs refuses it, saying what differs, and adopts nothing
        changed = tmp_path / "python-other"
        shutil.copy(psutil.Process(os.getpid()).exe(), changed)
        with open(changed, "ab") as fh:
            fh.write(b"\0")  # the same interpreter, another program by its hash
        start_protected(other, other_events, str(changed))
        refused = other.wait_for(
            lambda: fleet_files(other).get(name, {}).get("code") == "FLEET_CERT_MISMATCH" and fleet_files(other)[name]
        )
        assert "program" in refused["why"] and refused["status"] == "refused", refused
        assert event(other, "FLEET_CERT_MISMATCH")["data"]["node"] == "gpu-a"
        assert not other.call("certificates")["certificates"]
        for proc in other.children:
            proc.terminate()
            proc.wait(30)

        start_protected(twin, twin_events)
        start_job(twin)

        # the twin confirms it with a run of its own; while an OFF window holds the work,
        # explain says why it waits: the twin's certificate being confirmed
        confirming = event(twin, "FLEET_CERT_CONFIRMING")
        assert confirming["data"]["node"] == "gpu-a" and confirming["data"]["blocks"] >= 6
        off = twin.reasons("llmbatch", "AB_WINDOW_OFF", timeout=60)
        said = next(r for r in off if r["code"] == "AB_WINDOW_OFF")
        assert "confirms on this node the certificate gpu-a earned" in said["message"], said
        adopted = event(twin, "FLEET_CERT_ADOPTED", timeout=300)
        assert adopted["data"]["node"] == "gpu-a", twin.call("timeline", limit=100)
        certs = twin.call("certificates")["certificates"]
        assert [(c["duty"], c["status"], c["origin"]) for c in certs] == [(0.1, "valid", "gpu-a")], certs
        assert certs[0]["confirm_blocks"] == confirming["data"]["blocks"]
        shown = twin.cli("certificates")
        assert "adopted from gpu-a after a confirmation of" in shown.stdout.replace("\n", " "), shown.stdout
        # ... and the certified work runs under it, as under one earned here
        duty = twin.wait_for(
            lambda: (d := twin.call("duty")["duty"])["jobs"] and d["jobs"][0]["asked"] > 0 and d, timeout=60
        )
        assert duty["ceiling"] == 0.1
        print(f"\nfirst certificate to the twin running certified work: {time.time() - first_cert_at:.1f}s")

        assert fleet_files(twin)[name]["status"] == "adopted"
    finally:
        for node in nodes:
            node.close()
