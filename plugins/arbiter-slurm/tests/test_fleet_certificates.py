"""A certificate earned once serves its twins, on a real Slurm cluster of five nodes sharing one
certificate folder: n1 earns it with a sweep and publishes it; n2, n3 and n4 confirm it with
short runs of their own and adopt it, and each then advertises the certified duty to Slurm
(``arbiter-duty-10``) as n1 does; n5, whose protected program is another (one byte added to
the interpreter: another SHA-256), refuses it and advertises none.

One node's programs run at a time: on a small shared box several stand-ins and their work at
once would slow each other more than the work under test does.  The figures printed: the time
from the first certificate to the fourth node running certified work, against the sweep n1
ran (each of four independent nodes would run its own)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psutil
import pytest

from arbiter_testing.needs import need
from arbiter_testing.node import HarnessNode
from arbiter_testing.slurm import SlurmCluster, unavailable
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
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.alone, pytest.mark.timeout(900)]

NODES = ["n1", "n2", "n3", "n4", "n5"]
NAME = "n1.frames.gpu.cert.json"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    need("slurm", unavailable())
    cluster = SlurmCluster(tmp_path, NODES)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def advertises(cluster: SlurmCluster, name: str) -> bool:
    return "arbiter-duty-10" in cluster.features().get(name, set())


def test_one_node_earns_three_twins_confirm_and_advertise_and_another_program_refuses(cluster: SlurmCluster) -> None:
    shared = cluster.root / "certificates"
    shared.mkdir()
    keys = {name: make_key(cluster.root / f"arbiter-{name}") for name in NODES}
    nodes: dict[str, HarnessNode] = {}
    for name in NODES:
        node = cluster.start_arbiter(
            name,
            **{**CERTIFIED, "tick_s": 0.5},
            fleet_certificates={"folder": str(shared), "node_name": name, "trusted_keys": keys, **FLEET},
        )
        node.add_rule("frames", stand_in_rule(node.root / "progress.jsonl"))
        nodes[name] = node

    earner = nodes["n1"]
    start_stand_in(earner, earner.root / "progress.jsonl")
    start_job(earner)
    swept_from = time.time()
    swept = earner.cli("ab", "sweep", "--rule", "frames", "--levels", "0.1,0.45", *RUN, "--follow", timeout=600)
    assert swept.returncode == 0 and "certified duty 0.1" in swept.stdout, swept.stdout[-3000:] + swept.stderr
    sweep_s = newest_event(earner, "AB_SWEEP_DONE")["t"] - swept_from
    first_cert_at = min(e["t"] for e in earner.call("timeline", code="FLEET_CERT_PUBLISHED", limit=10)["events"])
    stop_programs(earner)
    wait_until(partial(advertises, cluster, "n1"), 60, "n1 advertises its certified duty")

    confirm_s = {}
    for name in ("n2", "n3", "n4"):
        twin = nodes[name]
        start_stand_in(twin, twin.root / "progress.jsonl")
        start_job(twin)
        started = newest_event(twin, "FLEET_CERT_CONFIRMING")
        assert started["data"]["node"] == "n1", started
        adopted = newest_event(twin, "FLEET_CERT_ADOPTED", timeout=300)
        confirm_s[name] = adopted["t"] - started["t"]
        certs = held_certificates(twin)
        assert [(c["duty"], c["status"], c["origin"]) for c in certs] == [(0.1, "valid", "n1")], certs
        running_certified(twin)
        # an adopted certificate is advertised to Slurm as one earned there is
        wait_until(partial(advertises, cluster, name), 60, f"{name} advertises duty 10")
        stop_programs(twin)
    fourth_s = time.time() - first_cert_at

    other = nodes["n5"]
    changed = cluster.root / "python-other"
    shutil.copy(psutil.Process(os.getpid()).exe(), changed)
    with open(changed, "ab") as fh:
        fh.write(b"\0")
    start_stand_in(other, other.root / "progress.jsonl", str(changed))
    refused = other.wait_for(
        lambda: fleet_files(other).get(NAME, {}).get("code") == "FLEET_CERT_MISMATCH" and fleet_files(other)[NAME]
    )
    assert "program" in refused["why"], refused
    assert not other.call("certificates")["certificates"]
    assert not any(f.startswith("arbiter-duty") for f in cluster.features()["n5"])
    stop_programs(other)

    print(
        f"\nn1's sweep (levels 0.1, 0.45): {sweep_s:.1f}s; confirmations "
        + ", ".join(f"{n} {s:.1f}s" for n, s in confirm_s.items())
        + f"\nfirst certificate to the fourth node running certified work: {fourth_s:.1f}s with the twins "
        f"confirming one after another here ({max(confirm_s.values()):.1f}s where each twin is its own machine); "
        f"four independent sweeps: {4 * sweep_s:.1f}s one after another, {sweep_s:.1f}s side by side"
    )
