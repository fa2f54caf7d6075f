"""The GPU share history the status page draws: one point per tick, oldest first, bounded."""

from __future__ import annotations

from arbiter.daemon.observe import TickView
from arbiter.daemon.sharehistory import MAX_POINTS, ShareHistory, capacity, share_view
from arbiter.engine.types import RuleObs
from arbiter.plugin import ProcessRef


def view(now: float, shares: dict[str, float | None], jobs: dict[str, float | None]) -> TickView:
    rules = {
        rid: RuleObs(rid, s != 0.0, frozenset({1}), s, "" if s is not None else "unread") for rid, s in shares.items()
    }
    return TickView(
        now=now,
        rules=rules,
        job_processes={jid: (ProcessRef(100 + i, 1.0),) for i, jid in enumerate(jobs)},
        job_busy=jobs,
        alive=frozenset(),
        reader="cpu_time",
        reader_why="",
        table_size=1,
        scan_s=0.0,
    )


def test_one_point_per_tick_oldest_first_and_bounded() -> None:
    history = ShareHistory(tick_s=1.0, window_s=5.0)
    for i in range(8):
        history.add(view(float(i), {"render": i / 10}, {"a": 0.1, "b": 0.2}), 1000.0 + i)
    points = history.points()
    assert [p.t for p in points] == [1003.0, 1004.0, 1005.0, 1006.0, 1007.0]  # the last 5 s at 1 a tick
    assert [p.tenants["render"] for p in points] == [0.3, 0.4, 0.5, 0.6, 0.7]
    assert all(abs((p.jobs or 0) - 0.3) < 1e-9 for p in points)


def test_the_points_handed_out_never_change_under_a_reader() -> None:
    history = ShareHistory(tick_s=1.0, window_s=3.0)
    history.add(view(0.0, {"r": 0.5}, {}), 1.0)
    seen = history.points()
    history.add(view(1.0, {"r": 0.6}, {}), 2.0)
    assert [p.t for p in seen] == [1.0] and [p.t for p in history.points()] == [1.0, 2.0]
    assert history.points() is history.points()  # one tuple per tick, not a copy per reader


def test_an_unread_share_stays_unknown_and_a_job_unread_makes_the_total_unknown() -> None:
    history = ShareHistory(tick_s=1.0)
    history.add(view(0.0, {"r": None, "idle": 0.0}, {"a": None, "b": 0.5}), 1.0)
    (p,) = history.points()
    assert p.tenants == {"r": None, "idle": 0.0} and p.jobs is None
    history.add(view(1.0, {"r": 0.2}, {}), 2.0)
    assert history.points()[-1].jobs == 0.0  # no job: none of the GPU is theirs


def test_the_window_holds_its_length_at_one_point_a_tick_within_a_cap() -> None:
    assert capacity(0.5, 600.0) == 1200 and capacity(2.0, 600.0) == 300
    assert capacity(0.0001, 600.0) == MAX_POINTS and capacity(1000.0, 600.0) == 1


def test_the_status_columns_align_and_a_tenant_loaded_later_reads_null_before() -> None:
    history = ShareHistory(tick_s=1.0)
    history.add(view(0.0, {"a": 0.123456}, {"j": 0.25}), 10.0)
    history.add(view(1.0, {"a": 0.5, "b": 1.0}, {}), 11.0)
    cols = share_view(history.points())
    assert cols["t"] == [10.0, 11.0] and cols["jobs"] == [0.25, 0.0]
    assert cols["tenants"] == {"a": [0.1235, 0.5], "b": [None, 1.0]}
    assert share_view(()) == {"window_s": 600.0, "t": [], "tenants": {}, "jobs": []}


def test_the_status_columns_are_few_whatever_the_tick() -> None:
    from arbiter.daemon.sharehistory import COLUMNS, SharePoint

    points = [SharePoint(float(i), {"p": 0.5 if i % 2 else None}, float(i % 3)) for i in range(1000)]
    cols = share_view(points)
    assert len(cols["t"]) <= COLUMNS and cols["t"][-1] == 999.0
    assert cols["tenants"]["p"] == [0.5] * len(cols["t"])  # the unread ticks left out of each mean
    assert all(0.0 <= j <= 2.0 for j in cols["jobs"])


def test_a_tenant_whose_rule_is_gone_leaves_the_columns() -> None:
    history = ShareHistory(tick_s=1.0)
    history.add(view(0.0, {"a": 0.5, "gone": 0.25}, {}), 10.0)
    assert list(share_view(history.points(), loaded={"a"})["tenants"]) == ["a"]
