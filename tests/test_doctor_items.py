"""`doctor` on a rule's source: a program that is not running is no fault; one that runs
while its source cannot be read gets a fix that fits."""

from __future__ import annotations

from arbiter.daemon.health import source_item

REFUSED = {
    "slot": "busy",
    "kind": "http_count",
    "readable": False,
    "needs_helper": False,
    "why": "cannot connect to http://127.0.0.1:8188/queue: connection refused",
    "read_by": "daemon",
}


def test_a_server_that_is_not_running_is_not_a_fault() -> None:
    item = source_item("diffusion-server", REFUSED, running=False)
    assert item.ok and "not read while diffusion-server is not running" in item.detail and not item.fix


def test_a_running_program_whose_source_fails_gets_a_fix_that_fits() -> None:
    item = source_item("diffusion-server", REFUSED, running=True)
    assert not item.ok and "connection refused" in item.detail
    assert "URL, port" in item.fix and "path or permissions" not in item.fix


def test_a_file_only_its_owner_reads_asks_for_the_helper() -> None:
    item = source_item("t", {**REFUSED, "needs_helper": True}, running=False)
    assert not item.ok and "arbiter helper" in item.fix


def test_a_readable_source_says_who_reads_it() -> None:
    item = source_item("t", {**REFUSED, "readable": True, "read_by": "helper (uid 1000)"}, running=True)
    assert item.ok and item.detail == "busy (http_count) read by helper (uid 1000)"


def test_a_source_that_advances_while_no_process_matches_is_a_fault_with_the_way_to_see_why() -> None:
    moving = {**REFUSED, "slot": "progress", "kind": "log", "readable": True, "rate": 45.0}
    item = source_item("trainer", moving, running=False)
    assert not item.ok and "advances at 45/s while no process matches" in item.detail
    assert "arbiter rules trainer" in item.fix
    assert source_item("trainer", moving, running=True).ok
