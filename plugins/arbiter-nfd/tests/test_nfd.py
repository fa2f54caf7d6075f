"""The node-feature-discovery file: its labels, its expiry, and an atomic write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arbiter.pluginmanager import build_plugin_manager
from arbiter_nfd import arbiter_node_state, render, write_atomically

STATE = {
    "gpu_apis": {"host": ["cuda", "vulkan"], "containers": ["cuda"]},
    "gpu_jobs_admitted": False,
    "certified_duty": {"trainer": 0.35},
    "gpu_jobs": "certified",
    "at": 1_800_000_000.0,
}


def test_labels_and_expiry() -> None:
    text = render(STATE, 1_800_000_000.0)
    assert text.splitlines() == [
        "# +expiry-time=2027-01-15T08:10:00Z",
        "arbiter-certified-duty-trainer=0.35",
        "arbiter-container-gpu-api-cuda=true",
        "arbiter-gpu-api-cuda=true",
        "arbiter-gpu-api-vulkan=true",
        "arbiter-gpu-jobs-admitted=false",
    ]


def test_written_whole_through_a_dotfile_and_never_into_a_missing_folder(tmp_path: Path) -> None:
    target = tmp_path / "features.d" / "arbiter"
    assert not write_atomically(target, "x=1\n") and not target.parent.exists()
    target.parent.mkdir()
    assert write_atomically(target, "x=1\n")
    assert target.read_text() == "x=1\n" and os.listdir(target.parent) == ["arbiter"]


def test_the_hook_writes_where_the_environment_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "arbiter"
    monkeypatch.setenv("ARBITER_NFD_FILE", str(target))
    told = arbiter_node_state(state=STATE)
    assert "arbiter-gpu-api-vulkan=true" in target.read_text()
    # what it wrote, for status and metrics
    assert told is not None and told["scheduler"] == "nfd" and "arbiter-gpu-api-vulkan=true" in told["labels"]
    monkeypatch.setenv("ARBITER_NFD_FILE", str(tmp_path / "no-nfd-here" / "arbiter"))
    assert arbiter_node_state(state=STATE) is None  # nothing written, nothing told


def test_registered_through_its_entry_point() -> None:
    names = {p["name"] for p in build_plugin_manager().plugins()}
    assert "nfd" in names


def test_label_names_stay_valid_and_distinct() -> None:
    long_a, long_b = "x" * 70 + "-a", "x" * 70 + "-b"
    state = {"gpu_apis": None, "gpu_jobs_admitted": True, "certified_duty": {"db-": 0.1, long_a: 0.2, long_b: 0.3}}
    lines = render(state, 0.0).splitlines()[1:]
    names = [line.split("=")[0] for line in lines]
    assert len(set(names)) == len(names) == 4  # no API labels before the probes answered
    for name in names:
        assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum(), name
