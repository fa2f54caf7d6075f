"""The README's first lines work on a stock Debian or Ubuntu, whose system Python refuses
`pip install` outside a virtual environment (PEP 668), and say what the demo shows."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_way_to_get_uv_works_on_an_externally_managed_python() -> None:
    for page in ("README.md", "CONTRIBUTING.md"):
        text = (ROOT / page).read_text()
        assert "pipx install uv" in text, page
        assert "`python3 -m pip install uv`" not in text.replace("refuse `python3 -m pip install uv`", ""), page


def test_the_demo_line_says_what_the_demo_does() -> None:
    text = (ROOT / "README.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("uv run arbiter demo"))
    assert "what the daemon needs" not in line
    assert "arbiter demo --proof" in text
