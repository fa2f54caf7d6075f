"""The reference job: an exact golden for the stand-in backend, and its doctor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "llmbatch"


def llmbatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmbatch", *args],
        cwd=JOB,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_the_stand_in_matches_its_golden_exactly_at_any_width() -> None:
    golden = (JOB / "golden" / "stand-in.jsonl").read_text()
    assert llmbatch("run").stdout == golden
    assert llmbatch("run", "--width", "24").stdout == golden  # the work per step changes, the text does not
    assert len(golden.splitlines()) == len((JOB / "prompts.txt").read_text().split("\n")) - 1


def test_the_payload_overrides_options() -> None:
    import os

    out = llmbatch("run", env={**os.environ, "ARBITER_PAYLOAD": json.dumps({"steps": 3})})
    assert [len(json.loads(line)["text"]) for line in out.stdout.splitlines()] == [3, 3, 3, 3]


def test_doctor_lists_which_backends_load_here() -> None:
    out = llmbatch("doctor", "--models", "/nonexistent").stdout
    assert "stand-in   loads" in out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == {"stand-in", "mlx", "llama.cpp"}
    for backend in ("mlx", "llama.cpp"):
        assert "loads" in lines[backend] or "cannot load" in lines[backend]
