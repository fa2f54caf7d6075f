"""The node in Slurm's terms, against a real slurmctld: features for --constraint that follow
admission, a drain with arbiter's reason while protection holds GPU work too long (and only
arbiter's drains lifted), and features set again after slurmctld restarts."""

from __future__ import annotations

import sys

import pytest

from arbiter_testing.slurm import SlurmCluster
from arbiter_testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(240)]

WAIT_S = 60.0
ERRORS = (AssertionError, ValueError)


def test_admission_features_and_drain_follow_protection(slurm: SlurmCluster) -> None:
    n1 = slurm.start_arbiter("n1", slurm={"drain_after_s": 2})
    slurm.start_arbiter("n2", slurm={"drain_after_s": 2})
    marker = f"arbiter.demo.protected --events {slurm.root / 'p.jsonl'}"
    n1.add_rule("prot", {"id": "prot", "match": {"cmdline": [marker]}, "protect": {"metric": "gpu_share"}})
    wait_until(
        lambda: all({"arbiter", "arbiter-admit"} <= f for f in slurm.features().values()),
        WAIT_S,
        "arbiter-admit on both nodes",
        poll_s=0.2,
    )
    # the daemon's status (and so its page and metrics) says what Slurm is told
    (told,) = wait_until(lambda: n1.status()["scheduler_labels"], WAIT_S, "n1's features in its status")
    assert told["scheduler"] == "slurm" and told["node"] == "n1" and "arbiter-admit" in told["labels"], told
    assert told["error"] == "", told

    protected = n1.spawn([sys.executable, "-m", "arbiter.demo.protected", "--events", str(slurm.root / "p.jsonl")])
    try:
        wait_until(
            lambda: "arbiter-admit" not in slurm.features()["n1"], WAIT_S, "n1 without arbiter-admit", poll_s=0.2
        )
        assert "arbiter" in slurm.features()["n1"]  # the static feature stays
        wait_until(
            lambda: "arbiter-admit" not in n1.status()["scheduler_labels"][0]["labels"], WAIT_S, "n1's status says so"
        )
        job = slurm.sbatch("sleep 300\n", "--constraint=arbiter-admit")
        node = wait_until(lambda: slurm.jobs()[job]["nodes"] or None, WAIT_S, "the job placed", poll_s=0.2)
        assert node == "n2"
        reason = wait_until(lambda: slurm.reasons().get("n1"), WAIT_S, "n1 drained", poll_s=0.2)
        assert reason == "arbiter: prot PROTECTED_GPU_BUSY", reason
        slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=maintenance")
    finally:
        protected.terminate()
        protected.wait()
    wait_until(lambda: "n1" not in slurm.reasons(), WAIT_S, "n1's arbiter drain lifted", poll_s=0.2)
    wait_until(lambda: "arbiter-admit" in slurm.features()["n1"], WAIT_S, "arbiter-admit back on n1", poll_s=0.2)
    assert slurm.reasons().get("n2") == "maintenance"  # the operator's drain is never lifted


def test_features_are_set_again_after_slurmctld_restarts(slurm: SlurmCluster) -> None:
    slurm.start_arbiter("n1")
    wait_until(lambda: "arbiter-admit" in slurm.features()["n1"], WAIT_S, "arbiter-admit on n1", poll_s=0.2)
    slurm.restart_controller()
    # slurm.conf's features come back first; arbiter's own within a reconcile period (5 s)
    wait_until(
        lambda: "arbiter-admit" in slurm.features()["n1"],
        WAIT_S,
        "arbiter-admit on n1 again",
        poll_s=0.2,
        ignore=ERRORS,
    )
