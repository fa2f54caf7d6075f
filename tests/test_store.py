"""SQLite state and the paused journal."""

from __future__ import annotations

import json
from pathlib import Path

from arbiter.state.journal import PausedEntry, PausedJournal
from arbiter.state.store import JobRecord, Store


def test_journal_replay_keeps_what_is_still_paused(tmp_path: Path) -> None:
    journal = PausedJournal(tmp_path / "j")
    a = PausedEntry("job1", "tree", 10, 1.5, "signal")
    b = PausedEntry("job1", "tree", 11, 1.6, "signal")
    journal.append("pause", a)
    journal.append("pause", b)
    journal.append("resume", a)
    journal.close()
    with open(tmp_path / "j", "a") as fh:
        fh.write('{"op": "pause", "job_id": "torn')  # a write cut by a crash
    assert PausedJournal.replay(tmp_path / "j") == {b.key: b}


def test_a_batch_is_one_line_and_lines_of_an_earlier_daemon_still_replay(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with open(path, "w") as fh:  # a dict per line, as daemons before the batched form wrote
        fh.write(
            '{"op": "pause", "job_id": "old", "how": "control", "pid": 9, "start_time": 0.5, '
            '"translator": "control_doc", "control_path": "/c.json"}\n'
        )
    journal = PausedJournal(path)
    batch = [
        PausedEntry(f"job{i}", "tree", 100 + i, 1.25 + i, "signal", '/run/"ü"\\doc.json' if i else None)
        for i in range(3)
    ]
    journal.append_many("pause", batch)
    journal.append_many("resume", batch[1:2])
    journal.append_many("resume", [])  # writes nothing
    journal.close()
    assert len(path.read_text().splitlines()) == 3
    with open(path, "a") as fh:
        fh.write('{"op": "pause", "entries": [["short", "tree"]]}\n')  # a row that names no process
    old = PausedEntry("old", "control", 9, 0.5, "control_doc", "/c.json")
    assert PausedJournal.replay(path) == {old.key: old, batch[0].key: batch[0], batch[2].key: batch[2]}


def test_timeline_paused_and_jobs_survive_reopening(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    with store.transaction() as db:
        Store.add_event(db, {"t": 1.0, "code": "JOB_PAUSED", "subject": "j", "message": "m", "data": {"x": 1}})
        Store.add_event(db, {"t": 2.0, "code": "JOB_RESUMED", "subject": "k", "message": "m", "data": {}})
        Store.put_paused(db, PausedEntry("j", "control", 5, 2.0, "control_doc", "/c.json"))
        Store.put_job(db, JobRecord("j", 1000, "batch", {"name": "batch"}, ["x"], 1, 1.0, "/c", "/e", 3.0))
    store.save_rule_file("/t/a.yaml", "id: a\n")
    store.close()
    store = Store(tmp_path / "s.db")
    assert [e["code"] for e in store.timeline()] == ["JOB_PAUSED", "JOB_RESUMED"]
    assert store.timeline(subject="j")[0]["data"] == {"x": 1}
    assert store.timeline(code="JOB_RESUMED")[0]["subject"] == "k"
    assert store.paused()[0].control_path == "/c.json"
    assert store.jobs()[0].cmd == ["x"]
    assert store.last_good_rule_files() == {"/t/a.yaml": "id: a\n"}
    store.clear_paused()
    assert store.paused() == []


def test_protections_survive_reopening_and_a_row_that_is_not_spans_is_left_out(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    with store.transaction() as db:
        Store.put_protections(db, {"game": (4.0, 26.0), "render": (), "ok": [3]})
        db.execute("INSERT INTO protections VALUES (?, ?)", ("torn", "[1.0, "))
        db.execute("INSERT INTO protections VALUES (?, ?)", (None, "[1.0]"))
        db.execute("INSERT INTO protections VALUES (?, ?)", ("odd", '{"a": 1}'))
        db.execute("INSERT INTO protections VALUES (?, ?)", ("long", json.dumps([1e999, -1, *range(30)])))
    store.close()
    store = Store(tmp_path / "s.db")
    # none kept for a rule with none; of a long row only the latest spans, each a finite duration
    assert store.protections(20) == {"game": (4.0, 26.0), "ok": (3.0,), "long": tuple(float(x) for x in range(10, 30))}
