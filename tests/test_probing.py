"""GPU API probes run each in its own process; what the host provides; where a job can run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from arbiter.config.jobdocs import Manifest
from arbiter.pluginmanager import build_plugin_manager
from arbiter.probing import PROBE_NICE, gpu_apis, placement, run_probe

ROOT = Path(__file__).resolve().parents[1]

BROKEN = textwrap.dedent("""
    import os, time
    from arbiter.plugin import KindOptions, Probe, hookimpl

    class Hangs(Probe):
        Options = KindOptions
        def probe(self):
            time.sleep(60)

    class Crashes(Probe):
        Options = KindOptions
        def probe(self):
            os.abort()

    class Niceness(Probe):
        Options = KindOptions
        def probe(self):
            return True, f"nice {os.nice(0)}"

    class Garbage(Probe):
        Options = KindOptions
        def probe(self):
            print("not json at all")
            return "yes"  # not (usable, evidence)

    @hookimpl
    def arbiter_register_probes(register):
        register("hangs", Hangs)
        register("crashes", Crashes)
        register("garbage", Garbage)
        register("niceness", Niceness)
""")


@pytest.fixture
def broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "broken_probes.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "broken_probes"


def test_a_host_without_a_gpu_provides_nothing_and_says_why_for_every_api(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARBITER_CONFIG"}
    out = subprocess.run(
        [sys.executable, "-m", "arbiter", "gpu-apis", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**env, "XDG_CONFIG_HOME": str(tmp_path)},
        check=True,
    )
    answer = json.loads(out.stdout)
    assert set(answer) >= {"host", "containers", "evidence", "platform", "arbiter_version"}
    assert set(answer["evidence"]) == set(build_plugin_manager().kind_names("probes"))
    for api, text in answer["evidence"].items():
        assert text and "probe failed" not in text and "did not answer" not in text, (api, text)
    print("\n" + json.dumps(answer, indent=1))


@pytest.mark.parametrize(
    ("kind", "timeout_s", "said"),
    [("hangs", 3, "did not answer within 3s"), ("crashes", 60, "probe failed"), ("garbage", 60, "probe failed")],
)
def test_a_broken_probe_cannot_hang_or_crash_the_asker(
    broken_plugin: str, kind: str, timeout_s: float, said: str
) -> None:
    answer = run_probe(kind, [broken_plugin], timeout_s=timeout_s)
    assert answer["usable"] is False and said in answer["evidence"], answer


def test_gpu_apis_counts_only_usable_ones(broken_plugin: str) -> None:
    answer = gpu_apis(["garbage", "metal"], [broken_plugin], timeout_s=10)
    assert answer["host"] == [] and set(answer["evidence"]) == {"garbage", "metal"}


def test_a_probe_runs_nicer_than_its_asker_so_probing_takes_no_cpu_from_a_protected_program(broken_plugin: str) -> None:
    answer = run_probe("niceness", [broken_plugin], timeout_s=60)
    assert answer["usable"] and answer["evidence"] == f"nice {min(19, os.nice(0) + PROBE_NICE)}", answer


PROVIDED = {
    "host": ["vulkan"],
    "containers": ["cuda"],
    "evidence": {"cuda": "no NVIDIA driver", "metal": "not this platform", "vulkan": "a GPU"},
}


def test_placement_checks_apis_against_the_host_or_its_containers() -> None:
    needs_cuda = Manifest.model_validate({"name": "train", "gpu": {"use": "shared", "apis_any": ["cuda"]}})
    why, _ = placement(needs_cuda, "linux", PROVIDED)
    assert why and "cuda" in why and "no NVIDIA driver" in why
    in_container = Manifest.model_validate(
        {"name": "train", "gpu": {"use": "shared", "apis_any": ["cuda"], "in_container": True}}
    )
    assert placement(in_container, "linux", PROVIDED)[0] is None
    either = Manifest.model_validate({"name": "r", "gpu": {"use": "shared", "apis_any": ["cuda", "vulkan"]}})
    assert placement(either, "linux", PROVIDED)[0] is None


def test_a_platform_variant_replaces_gpu_whole() -> None:
    manifest = Manifest.model_validate(
        {
            "name": "infer",
            "gpu": {"use": "shared", "apis_any": ["vulkan"]},
            "variants": {"darwin": {"use": "shared", "apis_any": ["metal"]}},
        }
    )
    assert placement(manifest, "linux", PROVIDED)[0] is None
    why, _ = placement(manifest, "darwin", PROVIDED)  # the platform injected: the darwin variant counts
    assert why and "metal" in why and "not this platform" in why


def test_unknown_api_names_are_accepted_with_a_warning() -> None:
    manifest = Manifest.model_validate({"name": "x", "gpu": {"use": "shared", "apis_any": ["webgpu", "vulkan"]}})
    why, warnings = placement(manifest, "linux", PROVIDED)
    assert why is None and warnings and "webgpu" in warnings[0]
