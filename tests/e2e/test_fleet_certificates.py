"""Certificates shared with twins, end to end on real daemons sharing one folder: one node
earns a certificate with a paired run and publishes it; a twin confirms it with a short run of
its own, adopts it and runs certified work under it; a node whose protected program differs
refuses it and says so, as does a node whose confirmation shows its program slowed more; a
file cut short, or copied under another node's name, is refused with its reason.

The three daemons run on this one machine, so their CPU, GPUs, OS and arbiter match, as twins'
do; the third node's program is a copy of the interpreter with one byte added (another
program, another SHA-256).  One node's programs run at a time: on a small shared box three
stand-ins and their work at once would slow each other more than the work under test does."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil
import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.twins import (
    CERTIFIED,
    FLEET,
    RUN,
    fleet_files,
    held_certificates,
    make_key,
    newest_event,
    running_certified,
    stand_in_rule,
    start_job,
    start_stand_in,
    stop_programs,
)

pytestmark = [pytest.mark.alone, pytest.mark.timeout(900)]

NAME = "gpu-a.frames.gpu.cert.json"


def test_a_twin_confirms_and_adopts_a_certificate_and_another_program_refuses_it(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    keys = {name: make_key(tmp_path / name) for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")}
    nodes = {}
    for name in keys:
        node = HarnessNode(
            tmp_path / name,
            **CERTIFIED,
            fleet_certificates={"folder": str(shared), "node_name": name, "trusted_keys": keys, **FLEET},
        )
        node.add_rule("frames", stand_in_rule(node.root / "progress.jsonl"))
        nodes[name] = node
    earner, twin, other, slower = nodes.values()
    try:
        for node in nodes.values():
            node.start()
        assert earner.call("certificates")["fleet"]["public_key"] == keys["gpu-a"]
        start_stand_in(earner, earner.root / "progress.jsonl")
        start_job(earner)
        earned = earner.cli("ab", "start", "--rule", "frames", "--duty", "0.1", *RUN, "--follow", timeout=600)
        assert earned.returncode == 0, earned.stdout[-3000:] + earned.stderr
        first_cert_at = newest_event(earner, "FLEET_CERT_PUBLISHED")["t"]
        assert (shared / NAME).exists()
        stop_programs(earner)

        # the node whose program differs refuses it, saying what differs, and adopts nothing
        changed = tmp_path / "python-other"
        shutil.copy(psutil.Process(os.getpid()).exe(), changed)
        with open(changed, "ab") as fh:
            fh.write(b"\0")  # the same interpreter, another program by its hash
        start_stand_in(other, other.root / "progress.jsonl", str(changed))
        refused = other.wait_for(
            lambda: fleet_files(other).get(NAME, {}).get("code") == "FLEET_CERT_MISMATCH" and fleet_files(other)[NAME]
        )
        assert "program" in refused["why"] and refused["status"] == "refused", refused
        assert newest_event(other, "FLEET_CERT_MISMATCH")["data"]["node"] == "gpu-a"
        assert not other.call("certificates")["certificates"]
        stop_programs(other)

        # the twin confirms it with a run of its own; while an OFF window holds the work,
        # explain says why it waits: the twin's certificate being confirmed
        start_stand_in(twin, twin.root / "progress.jsonl")
        start_job(twin)
        confirming = newest_event(twin, "FLEET_CERT_CONFIRMING")
        assert confirming["data"]["node"] == "gpu-a" and confirming["data"]["blocks"] >= 6
        off = twin.reasons("llmbatch", "AB_WINDOW_OFF", timeout=60)
        said = next(r for r in off if r["code"] == "AB_WINDOW_OFF")
        assert "confirms on this node the certificate gpu-a earned" in said["message"], said
        adopted = newest_event(twin, "FLEET_CERT_ADOPTED", timeout=300)
        assert adopted["data"]["node"] == "gpu-a", twin.call("timeline", limit=100)
        certs = held_certificates(twin)
        assert [(c["duty"], c["status"], c["origin"]) for c in certs] == [(0.1, "valid", "gpu-a")], certs
        assert certs[0]["confirm_blocks"] == confirming["data"]["blocks"]
        shown = twin.cli("certificates", COLUMNS="250")  # each cell on one line
        assert "adopted from gpu-a after a confirmation of" in shown.stdout, shown.stdout
        assert fleet_files(twin)[NAME]["status"] == "adopted"
        # ... and the certified work runs under it, as under one earned here
        assert running_certified(twin)["ceiling"] == 0.1
        print(f"\nfirst certificate to the twin running certified work: {time.time() - first_cert_at:.1f}s")
        stop_programs(twin)

        # a twin whose work slows its program far more than the original's did refuses it
        start_stand_in(slower, slower.root / "progress.jsonl")
        start_job(slower, gain=30.0)  # 30 % at duty 0.1, against 1 % where it was earned
        refusal = newest_event(slower, "FLEET_CERT_REFUSED", timeout=300)
        assert "is refused" in refusal["message"] and refusal["data"]["node"] == "gpu-a", refusal
        assert "slow" in refusal["message"], refusal  # slowed more here, or a slowdown shown
        assert fleet_files(slower)[NAME]["status"] == "refused"
        assert not slower.call("certificates")["certificates"]
        slower.reasons("llmbatch", "GPU_NOT_CERTIFIED")  # its work waits, as before

        # a file cut short, or a copy of one under another node's name, is refused with its reason
        (shared / "gpu-d.frames.gpu.cert.json").write_bytes((shared / NAME).read_bytes())
        (shared / "gpu-c.frames.gpu.cert.json").write_bytes((shared / NAME).read_bytes()[:100])
        files = twin.wait_for(lambda: len(found := fleet_files(twin)) == 3 and found)
        assert files["gpu-d.frames.gpu.cert.json"]["code"] == "FLEET_CERT_REPLAYED", files
        assert files["gpu-c.frames.gpu.cert.json"]["code"] == "FLEET_CERT_CORRUPT", files
        assert newest_event(twin, "FLEET_CERT_CORRUPT")["data"]["file"] == "gpu-c.frames.gpu.cert.json"
        assert files[NAME]["status"] == "adopted"
    finally:
        for node in nodes.values():
            node.close()
