"""Data is printed as written: rule tags, job names and what jobs report are never rich markup."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest
from rich.console import Console

from arbiter.cli.render import console, print_explain, print_status, print_timeline
from arbiter_testing.answers import job_answer, rule_answer, status_answer

HOSTILE = ["[/x]", "[upload]", "[link=https://evil.example]click[/link]", "[bold red]loud[/]"]
#: the terminal escape that starts a hyperlink (OSC 8): markup's [link] becomes one
HYPERLINK = "\x1b]8;"


def terminal() -> tuple[io.StringIO, Console]:
    out = io.StringIO()
    return out, console(file=out, force_terminal=True, width=400, color_system="truecolor")


def plain(out: io.StringIO) -> str:
    """What the terminal shows, without its colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())


def test_the_timeline_prints_tags_and_messages_as_written() -> None:
    out, con = terminal()
    events = [
        {
            "t": time.time(),
            "code": "PROTECTION_PHASE_ON",
            "subject": text,
            "message": f"a phase of 'mytrain' {text} is on",
        }
        for text in HOSTILE
    ]
    print_timeline(con, events)  # a tag "[/x]" raised MarkupError here
    shown = plain(out)
    for text in HOSTILE:
        assert f"a phase of 'mytrain' {text} is on" in shown
    assert HYPERLINK not in out.getvalue()


def test_explain_prints_what_a_job_reports_as_written() -> None:
    out, con = terminal()
    job = {
        "kind": "job",
        "id": "[red]job[/red]",
        "state": "held",
        "via": None,
        "duty": 1.0,
        "reported": {"phase": {"name": "[link=https://evil.example]compute[/link]"}, "why": "[/x] bad line"},
        "reasons": [{"code": "PROTECTED_GPU_BUSY", "message": "'[upload]' uses the GPU", "remedy": "wait [/]"}],
    }
    print_explain(console=con, e={"subject": "node", "notices": [], "items": [job]})
    shown = plain(out)
    assert "[red]job[/red]" in shown
    assert "phase [link=https://evil.example]compute[/link]" in shown
    assert "[/x] bad line" in shown and "'[upload]' uses the GPU" in shown and "wait [/]" in shown
    assert HYPERLINK not in out.getvalue()


def test_status_prints_rule_ids_and_job_names_as_written() -> None:
    out, con = terminal()
    status = status_answer(
        rules=[rule_answer("[upload]", phases=["[/x]"])],
        jobs=[job_answer("[b]batch")],
    )
    print_status(con, status)
    shown = plain(out)
    assert "[upload]" in shown and "[/x]" in shown and "[b]batch" in shown


def test_status_prints_what_the_fleet_scheduler_is_told() -> None:
    out, con = terminal()
    told = [
        {"scheduler": "slurm", "node": "n1", "labels": ["arbiter-admit", "arbiter-api-[cuda]"], "error": ""},
        {"scheduler": "nfd", "node": "gpu7", "labels": [], "error": "cannot write [/etc/x]"},
    ]
    status = status_answer(scheduler_labels=told)
    print_status(con, status)
    shown = plain(out)
    assert "slurm node n1: features arbiter-admit, arbiter-api-[cuda]" in shown, shown
    assert "nfd node gpu7: features none (cannot write [/etc/x])" in shown, shown


# --- into a file, a pipe or a CI log -------------------------------------------------------------

LONG = (
    "a phase of 'mytrain' is on, so GPU work waits until it ends; the protected program's own events file "
    "says so and nothing else holds this job back at the moment"
)


def piped() -> tuple[io.StringIO, Console]:
    out = io.StringIO()  # not a terminal, as stdout is under `> file` or `| less`
    return out, console(file=out)


def test_piped_explain_keeps_each_sentence_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out, con = piped()
    job: dict[str, Any] = {
        "kind": "job",
        "id": "batch",
        "state": "held",
        "via": None,
        "duty": 1.0,
        "reported": {},
        "reasons": [{"code": "PROTECTION_PHASE_ON", "message": LONG, "remedy": "wait for the phase to end"}],
    }
    print_explain(console=con, e={"subject": "node", "notices": [], "items": [job]})
    lines = out.getvalue().splitlines()
    assert f"PROTECTION_PHASE_ON {LONG}" in lines
    assert "\x1b[" not in out.getvalue()  # no colours in a file


def test_piped_tables_neither_split_codes_nor_pad_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out, con = piped()
    events = [{"t": time.time(), "code": "PROTECTION_PHASE_OFF", "subject": "mytrain", "message": LONG}]
    print_timeline(con, events)
    text = out.getvalue()
    assert "PROTECTION_PHASE_OFF" in text and LONG in text
    assert max(len(line) for line in text.splitlines()) < len(LONG) + 60  # as wide as it holds


def test_a_narrow_terminal_still_keeps_a_code_whole() -> None:
    out = io.StringIO()
    con = console(file=out, force_terminal=True, width=60, color_system=None)
    events = [{"t": time.time(), "code": "PROTECTION_PHASE_OFF", "subject": "mytrain", "message": LONG}]
    print_timeline(con, events)
    assert "PROTECTION_PHASE_OFF" in out.getvalue()


def test_columns_sets_the_width_of_piped_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    out, con = piped()
    print_timeline(con, [{"t": time.time(), "code": "X", "subject": "s", "message": LONG}])
    assert max(len(line) for line in out.getvalue().splitlines()) <= 70


def test_following_a_run_prints_its_id_as_written() -> None:
    from arbiter.cli.ab import follow

    out, con = terminal()
    run: dict[str, Any] = {"run": "[/x]", "duty": None, "target": 2, "blocks_done": 2, "status": "done", "live": {}}
    assert follow(con, lambda: [run], "[/x]", None) == run  # "[/x]" as markup raised MarkupError
    assert "[/x]" in plain(out)


def test_explain_says_how_long_protection_has_paused_a_job_and_when_that_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the line whole, whatever terminal the tests run beside
    out, con = piped()
    job = {
        "kind": "job",
        "id": "slurm-17",
        "state": "paused",
        "via": "tree",
        "duty": 0.0,
        "reported": {},
        "reasons": [{"code": "PROTECTED_GPU_BUSY", "message": "'render' uses the GPU", "remedy": "wait"}],
        "protection_pause": {"for_s": 42.5, "evict_after_s": 600.0, "evict_in_s": 557.5},
    }
    print_explain(console=con, e={"subject": "slurm-17", "notices": [], "items": [job]})
    assert "paused by protection for 42.5s; stopped in 557.5s if still paused (evict_after_s: 600)" in out.getvalue()
    out, con = piped()
    job["protection_pause"] = {"for_s": 42.5, "evict_after_s": None, "evict_in_s": None}
    print_explain(console=con, e={"subject": "slurm-17", "notices": [], "items": [job]})
    assert "it waits however long protection needs (evict_after_s: null)" in out.getvalue()
    out, con = piped()
    why = "the last 3 protection(s) by 'render' held fleet work 40s at the median (12s to 90s); ..."
    job["protection_pause"] = {"for_s": 0.5, "evict_after_s": 0.0, "evict_in_s": 0.0, "evict_basis": why}
    print_explain(console=con, e={"subject": "slurm-17", "notices": [], "items": [job]})
    assert "stopped in 0s if still paused (evict_after_s: 0)" in out.getvalue()
    assert f"evict_after_s is auto: {why}" in " ".join(out.getvalue().split()), out.getvalue()


def test_twins_certificates_show_their_origin_and_the_folder_as_written() -> None:
    """What a file in the shared folder says (a node's name) is anyone's who can write there."""
    from arbiter.cli.render import print_fleet_certificates

    out, con = terminal()
    cert = {"rule": "trainer", "work": "gpu", "duty": 0.35, "r": 0.99, "r_low": 0.98, "r_high": 1.0, "margin": 0.02}
    answer = {
        "certificates": [
            {**cert, "origin": "", "status": "valid", "why": "valid for 13.0 more days"},
            {**cert, "origin": HOSTILE[2], "confirm_blocks": 8, "status": "valid", "why": ""},
        ],
        "fleet": {
            "folder": "/shared/certs",
            "node": "gpu07",
            "public_key": "q9G0=",
            "files": [
                {"file": "x.cert.json", "node": HOSTILE[0], "rule": "trainer", "status": "refused", "why": HOSTILE[3]}
            ],
        },
    }
    print_fleet_certificates(con, answer)
    shown = plain(out)
    assert "earned here" in shown and f"adopted from {HOSTILE[2]} after a confirmation of 8 blocks" in shown
    assert "publishes to /shared/certs as gpu07" in shown and "q9G0=" in shown
    assert HOSTILE[0] in shown and HOSTILE[3] in shown and HYPERLINK not in out.getvalue()


def test_twins_file_names_print_their_control_characters_escaped() -> None:
    """A file name (or any text) from the shared folder with terminal escapes in it neither
    clears the reader's screen, colours a forged status nor plants a link."""
    from arbiter.cli.render import print_fleet_certificates

    out, con = terminal()
    name = "x\x1b[2J\x1b[31mFAKE-ADOPTED\x1b]8;;http://evil/\x1b\\\x9b0m.cert.json"
    fleet = {"folder": "/s", "node": "B", "public_key": "k", "files": [{"file": name, "status": "refused", "why": "w"}]}
    print_fleet_certificates(con, {"certificates": [], "fleet": fleet})
    raw = out.getvalue()
    assert "\x1b[2J" not in raw and "\x1b[31m" not in raw and HYPERLINK not in raw and "\x9b" not in raw
    assert "x\\x1b[2J\\x1b[31mFAKE-ADOPTED\\x1b]8;;http://evil/\\x1b\\\\x9b0m.cert.json" in plain(out)
