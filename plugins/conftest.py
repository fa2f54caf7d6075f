"""Fixtures the plugins' tests share.

A plugin's tests folder has no ``conftest.py`` of its own: the type checker knows the test
modules of a folder such as ``plugins/arbiter-probes/tests`` by their file names alone (the
folder above is no Python name), so two such ``conftest`` modules, or one beside the
repository's own, would be the same module to it.  What the tests import lives in
``arbiter_testing``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter.plugin import PluginContext
from arbiter_testing.needs import need
from arbiter_testing.probes import MakeProbe, probe_maker
from arbiter_testing.slurm import SlurmCluster, unavailable


@pytest.fixture
def context(tmp_path: Path) -> PluginContext:
    """A plugin's context, its state in this test's own folder."""
    return PluginContext(state_dir=tmp_path)


@pytest.fixture
def make_probe(context: PluginContext) -> MakeProbe:
    """Probes that look at a host the test describes (see :class:`arbiter_testing.probes.MakeProbe`)."""
    return probe_maker(context)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    """A real two-node Slurm cluster on loopback (see :mod:`arbiter_testing.slurm`): skipped
    where the Debian packages are not installed or the tests do not run as root, unless
    ``ARBITER_REQUIRE`` names ``slurm``; then the test fails."""
    need("slurm", unavailable())
    cluster = SlurmCluster(tmp_path, ["n1", "n2"])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Four real Slurm nodes on loopback, as a fleet is: n1 to n4 (skipped or failed as
    :func:`slurm` is).  One for every test of a module: a module's tests share it, each
    leaving it as it found it (mark them ``xdist_group`` so that one worker runs them all)."""
    need("slurm", unavailable())
    cluster = SlurmCluster(tmp_path_factory.mktemp("fleet"), ["n1", "n2", "n3", "n4"])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
