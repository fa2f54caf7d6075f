"""The conformance kit: llmbatch passes at 0.1, 0.3 and 0.7; a job that lies fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from arbiter.cli.conform import SpecResult, judge

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def conform(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "arbiter", "conform", str(path), "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    return out.returncode, json.loads(out.stdout)


@pytest.mark.alone
def test_llmbatch_holds_its_duties() -> None:
    code, report = conform(ROOT / "examples" / "llmbatch")
    results = {r["name"]: r for r in report["results"]}
    assert set(results) == {"duty-0.1", "duty-0.3", "duty-0.7"}
    for r in results.values():
        print(
            f"\n{r['name']}: asked {r['asked']}, reported {r['reported']:.3f} (its units waited "
            f"{r['waited']:.3f} for a CPU), measured {r['measured']:.3f}"
        )
        assert r["verdict"] == "pass", r
        assert r["measured"] < r["asked"] + 0.1 and r["measured_by"] == "CPU time of its busiest thread"
        # it ran its duty, or wanted to and the host did not give it a CPU: it did not hold back too much
        assert r["measured"] > r["asked"] - 0.1 or r["reported"] + r["waited"] > r["asked"] - 0.1, r
    assert code == 0


@pytest.mark.alone
def test_a_job_that_lies_about_its_duty_fails() -> None:
    code, report = conform(HERE / "liar")
    [r] = report["results"]
    assert code == 1 and r["verdict"] == "fail"
    # it spins flat out: about 1.0 where it has a core, and still well over 0.4 beside a busy one
    assert r["reported"] == pytest.approx(0.3) and r["measured"] > 0.5
    assert any("over 0.40" in why for why in r["why"]) and any("disagree" in why for why in r["why"])


def test_a_spec_whose_gpu_apis_the_host_lacks_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "conformance.yaml").write_text(
        'command: ["{python}", "-c", "pass"]\nspecs:\n  - {name: needs-metal, duty: 0.5, apis_any: [metal]}\n'
    )
    code, report = conform(tmp_path)
    [r] = report["results"]
    assert code == 0 and r["verdict"] == "skip" and "metal" in r["why"][0]


def test_a_job_that_never_reports_a_phase_fails(tmp_path: Path) -> None:
    (tmp_path / "conformance.yaml").write_text(
        'command: ["{python}", "-c", "pass"]\nspecs:\n  - {name: silent, duty: 0.5}\n'
    )
    code, report = conform(tmp_path)
    assert code == 1 and "no phase" in report["results"][0]["why"][0]


@pytest.mark.parametrize(
    ("reports", "measured", "verdict", "why"),
    [
        ([{"busy": 0.29, "duty": 0.3}, {"busy": 0.31, "duty": 0.3}], 0.32, "pass", ""),
        ([], 0.3, "fail", "no gpu_duty metric"),
        ([{"busy": 0.3, "duty": 1.0}], 0.3, "fail", "not the 0.3 it was given"),
        ([{"busy": 0.45, "duty": 0.3}], 0.45, "fail", "reports running at 0.45"),
        ([{"busy": 0.3, "duty": 0.3}], 0.9, "fail", "disagree"),
        ([{"busy": 0.3, "duty": 0.3}], None, "fail", "cannot measure"),
    ],
)
def test_judge(reports: list[dict[str, Any]], measured: float | None, verdict: str, why: str) -> None:
    result = judge(SpecResult("s", 0.3, measured=measured, measured_by="no reader"), reports)
    assert result.verdict == verdict and why in " ".join(result.why)


def test_children_a_job_leaves_behind_do_not_outlive_the_kit(tmp_path: Path) -> None:
    import psutil

    marker = f"arbiter-conform-leak-{tmp_path.name}"
    (tmp_path / "job.py").write_text(
        "import json, os, subprocess, time\n"
        f"subprocess.Popen(['sleep', '300', '{marker}'])\n"
        "open(os.environ['ARBITER_EVENTS'], 'a').write(json.dumps({'event': 'phase', 'phase': 'x'}) + '\\n')\n"
        "time.sleep(1)\n"  # exits on its own during the settle, leaving its child
    )
    (tmp_path / "conformance.yaml").write_text(
        'command: ["{python}", "job.py"]\nspecs:\n  - {name: leaves-a-child, duty: 0.5, window_s: 1, settle_s: 1.5}\n'
    )
    code, report = conform(tmp_path)
    assert code == 1 and "exited" in report["results"][0]["why"][0]
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not left
