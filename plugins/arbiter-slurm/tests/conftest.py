"""The Slurm tests' cluster (see :mod:`arbiter_testing.slurm`), skipped where the Debian
packages are not installed or the tests do not run as root, unless ``ARBITER_REQUIRE`` names
``slurm`` (as .ci/run sets it once it installed them): then they fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter_testing.slurm import SlurmCluster, unavailable


def need_slurm() -> None:
    why = unavailable()
    if why:
        if "slurm" in {part.strip() for part in os.environ.get("ARBITER_REQUIRE", "").split(",")}:
            pytest.fail(f"ARBITER_REQUIRE names slurm but {why}")
        pytest.skip(why)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    need_slurm()
    cluster = SlurmCluster(tmp_path, ["n1", "n2"])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[SlurmCluster]:
    """Four nodes, as a fleet is: n1 to n4."""
    need_slurm()
    cluster = SlurmCluster(tmp_path, ["n1", "n2", "n3", "n4"])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
