"""bench/fuzz_configs.py, run small: every format through its entry point, a table, exit 0."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    return load_script(ROOT / "bench" / "fuzz_configs.py", "fuzz_configs")


def test_a_small_run_prints_every_format_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load()
    assert bench.main(["--inputs", "20"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["format", "inputs", "accepted"]
    rows = {line.split()[0]: line.split() for line in table[2:] if line.strip()}
    assert set(rows) == set(bench.load_kit().FORMATS)
    for fmt, row in rows.items():
        assert row[1] == "20" and row[4:7] == ["0", "0", "0"], (fmt, row)


def test_unknown_formats_are_refused() -> None:
    with pytest.raises(SystemExit):
        _load().main(["--inputs", "1", "--formats", "rule,nosuch"])
