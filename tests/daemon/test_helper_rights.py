"""Which homes a session helper may speak for, and which paths lie in them."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from arbiter.daemon.helpers import Report, home_of, path_in_home


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("~/.local/state/t.jsonl", "/home/ann/.local/state/t.jsonl"),
        ("/home/ann/logs/t.log", "/home/ann/logs/t.log"),
        ("/home/ann/../bob/t.log", None),
        ("~/../bob/t.log", None),
        ("/home/annie/t.log", None),
        ("~bob/t.log", None),
        ("relative/t.log", None),
        ("/etc/shadow", None),
    ],
)
def test_path_in_home(raw: str, expected: str | None) -> None:
    assert path_in_home(raw, "/home/ann") == expected


def test_a_system_account_whose_home_is_the_root_speaks_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = pwd.struct_passwd(("svc", "x", 4242, 4242, "", "/", "/usr/sbin/nologin"))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: fake)
    home, why = home_of(4242)
    assert home is None and "system account" in why


def test_a_home_owned_by_someone_else_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = pwd.struct_passwd(("svc", "x", os.getuid() + 1, 1, "", str(tmp_path), "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: fake)
    home, why = home_of(os.getuid() + 1)
    assert home is None and f"owned by uid {os.getuid()}" in why


def test_reports_carry_counts_and_phases_only() -> None:
    Report.model_validate({"rule": "r", "index": 0, "readable": True, "count": 3, "phase": "on"})
    for extra in ({"content": "a line"}, {"command": ["/bin/sh"]}, {"phase": "maybe"}, {"count": -1}):
        with pytest.raises(ValueError):
            Report.model_validate({"rule": "r", "index": 0, "readable": True, **extra})


def test_what_a_helper_says_is_one_printable_line() -> None:
    """Status is every account's to read: a helper's why carries no terminal escape."""
    report = Report.model_validate(
        {"rule": "r", "index": 0, "readable": False, "why": "denied\x1b]8;;https://evil.example\x07\nsecond"}
    )
    assert report.why.isprintable() and "\n" not in report.why and report.why.startswith("denied")
