"""The status page at ``/`` against a provider with known answers: what is held and why,
escaping, the budget chart from the governor's events, the A/B plots."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

from fastapi.testclient import TestClient

from arbiter.http.app import create_app
from arbiter.http.budgetchart import budget_chart, budget_history
from arbiter.http.page import render_page

NOW = 1_800_000_000.0
EVIL = "<script>alert('x')</script>"


def governor_event(t: float, code: str, budget: float, ceiling: float = 0.5, rule: str = "frames") -> dict[str, Any]:
    return {
        "t": t,
        "code": code,
        "subject": rule,
        "message": f"{code} step",
        "data": {"rule": rule, "budget": budget, "ceiling": ceiling},
    }


class Provider:
    token = "t"

    def __init__(self) -> None:
        self.events = [
            governor_event(NOW - 60, "GPU_DUTY_BASELINE", 0.0),
            governor_event(NOW - 50, "GPU_DUTY_START", 0.5),
            governor_event(NOW - 30, "GPU_DUTY_HALVE", 0.25),
            governor_event(NOW - 10, "GPU_DUTY_GROW", 0.3),
            {"t": NOW - 5, "code": "JOB_PAUSED", "subject": "j-1", "message": f"paused {EVIL}", "data": {}},
        ]

    def status(self) -> dict[str, Any]:
        held = {
            "code": "PROTECTED_GPU_BUSY",
            "message": "'render' uses the GPU <now>",
            "remedy": "it runs once the GPU is free & stays so",
            "evidence": {"rule": "render"},
        }
        return {
            "version": "9.9",
            "uptime_s": 12.0,
            "gpu_jobs": "certified",
            "tick_s": 0.5,
            "processes": 80,
            "scan_ms": 1.5,
            "reader": {"name": "cpu_time", "why": "stand-in GPU", "vram": {}},
            "vram": {"total_bytes": 8 << 30, "free_bytes": 6 << 30, "jobs_bytes": 1 << 30, "unmanaged_bytes": 0},
            "fast_path": {"count": 0},
            "notices": [],
            "problems": {},
            "recorder": {"failures": 0, "last_error": ""},
            "scheduler_labels": [
                {"scheduler": "batch", "node": "gpu07", "labels": ["arbiter-admit", EVIL], "error": "slow <ctl>"}
            ],
            "jobs": [
                {
                    "kind": "job",
                    "id": "j-1",
                    "name": EVIL,
                    "state": "held",
                    "started": False,
                    "duty": 0.0,
                    "via": None,
                    "use": "shared",
                    "pids": [],
                    "measured_busy": None,
                    "reasons": [held],
                },
                {
                    "kind": "job",
                    "id": "j-2",
                    "name": "coop",
                    "state": "run",
                    "started": True,
                    "duty": 0.3,
                    "via": None,
                    "use": "shared",
                    "pids": [41, 42],
                    "measured_busy": 0.28,
                    "reasons": [],
                },
            ],
            "rules": [
                {
                    "kind": "rule",
                    "id": "render",
                    "priority": 50,
                    "protected": True,
                    "running": True,
                    "pids": [7],
                    "gpu_share": 0.61,
                    "gpu_why": "",
                    "using_gpu": True,
                    "using_for_s": 30.0,
                    "phases": ["uplink"],
                    "faults": [],
                    "sources": [],
                    "holds": [held],
                    "notes": [],
                    "vram_bytes": 2 << 30,
                    "reclaimable": True,
                    "releasing": None,
                },
            ],
        }

    def explain(self, subject: str | None) -> dict[str, Any]:
        return {"subject": subject or "node", "items": self.status()["jobs"], "notices": []}

    def timeline(self, limit: int, subject: str | None, code: str | None) -> list[dict[str, Any]]:
        return [e for e in self.events if code is None or e["code"] == code][-limit:]

    def duty(self) -> dict[str, Any]:
        return {
            "gpu_jobs": "certified",
            "budget": 0.3,
            "ceiling": 0.5,
            "summary": "budget 0.30 of ceiling 0.50 (running) beside frames; 1 job at 0.30 each",
            "rules": [
                {
                    "rule": "frames",
                    "state": "running",
                    "budget": 0.3,
                    "ceiling": 0.5,
                    "baseline": 120.0,
                    "baseline_age_s": 60.0,
                    "pressure": 0.01,
                    "level": None,
                    "take_back_left_s": None,
                }
            ],
            "jobs": [
                {"id": "j-1", "name": "x", "asked": 0.0, "measured": None, "state": "held", "reasons": []},
                {"id": "j-2", "name": "coop", "asked": 0.3, "measured": 0.28, "state": "holds its duty", "reasons": []},
            ],
        }

    def ab_status(self) -> list[dict[str, Any]]:
        return [
            {
                "run": "ab-open",
                "rule": "frames",
                "work": "gpu",
                "duty": 0.5,
                "status": "running",
                "verdict": "",
                "why": "",
                "blocks_done": 3,
                "target": 12,
                "excluded": 0,
                "started": NOW - 600,
                "ended": None,
            },
            {
                "run": "ab/old 1",
                "rule": "frames",
                "work": "gpu",
                "duty": 0.25,
                "status": "done",
                "verdict": "no slowdown shown",
                "why": "",
                "blocks_done": 12,
                "target": 12,
                "excluded": 1,
                "started": NOW - 9000,
                "ended": NOW - 5000,
            },
        ]

    def gpu_apis(self) -> dict[str, Any]:
        return {}

    def reload(self) -> None:
        pass

    def ab_show(self, run_id: str) -> dict[str, Any]:
        raise LookupError(f"no run {run_id!r}")

    def ab_plot(self, run_id: str) -> bytes:
        raise LookupError(f"no run {run_id!r}")

    def metrics(self) -> dict[str, Any]:
        return {"status": self.status(), "duty": self.duty()}


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text, as a browser would parse them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []  # an attribute with no value: ""
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {name: value or "" for name, value in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    tags.close()
    return tags


def test_the_page_shows_a_held_job_with_its_reason_and_remedy() -> None:
    page = render_page(Provider(), NOW)
    text = " ".join(parse(page).text)
    assert "j-1" in text and "held" in text
    assert "PROTECTED_GPU_BUSY" in text
    assert "'render' uses the GPU <now>" in text  # the message, read back as text
    assert "it runs once the GPU is free & stays so" in text
    assert "holds its duty" in text and "measured 0.28" in text
    assert "reader cpu_time" in " ".join(text.split()) and "stand-in GPU" in text
    assert "6.0 GB free of 8.0 GB" in text
    # what a fleet scheduler is told of the node, and why telling it failed
    assert "batch node gpu07: features" in text and "arbiter-admit" in text and "slow <ctl>" in text


def test_everything_from_the_provider_is_escaped() -> None:
    page = render_page(Provider(), NOW)
    assert EVIL not in page and "<now>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert not [t for t, _ in parse(page).tags if t == "script"]


def test_the_page_refreshes_itself_and_needs_no_script_or_external_asset() -> None:
    page = render_page(Provider(), NOW)
    tags = parse(page).tags
    refresh = [a for t, a in tags if t == "meta" and a.get("http-equiv") == "refresh"]
    assert refresh and 2 <= int(refresh[0]["content"] or 0) <= 5
    assert not [t for t, _ in tags if t in ("script", "link")]
    sources = [a.get("src") or "" for t, a in tags if t == "img"]
    assert all(s.startswith("/v1/ab/") for s in sources)


def test_the_budget_chart_has_a_point_per_governor_step() -> None:
    page = render_page(Provider(), NOW)
    tags = parse(page).tags
    assert [t for t, _ in tags].count("svg") == 1
    points = [a for t, a in tags if t == "circle" and a.get("class") == "budget-point"]
    assert [p["data-budget"] for p in points] == ["0", "0.5", "0.25", "0.3"]
    assert all(p["data-rule"] == "frames" for p in points)
    ys = [float(p["cy"] or 0) for p in points]
    assert ys[0] > ys[2] > ys[3] > ys[1]  # higher budgets sit higher
    xs = [float(p["cx"] or 0) for p in points]
    assert xs == sorted(xs)
    line = next(a for t, a in tags if t == "polyline" and a.get("class") == "budget-line")
    last_x = max(float(pt.split(",")[0]) for pt in (line["points"] or "").split())
    assert last_x > xs[-1]  # carried on to now
    assert "budget 0.30 of ceiling 0.50" in page


def test_budget_history_keeps_only_events_that_carry_a_budget() -> None:
    events = [
        governor_event(3.0, "GPU_DUTY_GROW", 0.4),
        governor_event(1.0, "GPU_DUTY_START", 0.2),
        {"t": 2.0, "code": "GPU_DUTY_START", "subject": "frames", "message": "", "data": {}},
        {"limit": 5, "subject": None, "code": None},
    ]
    series = budget_history(events)
    assert list(series) == ["frames"]
    assert [(p.t, p.budget) for p in series["frames"]] == [(1.0, 0.2), (3.0, 0.4)]


def test_an_empty_chart_says_so_and_old_steps_set_where_the_window_starts() -> None:
    assert "no governor step in this window" in budget_chart({}, {}, NOW)
    series = budget_history([governor_event(NOW - 7200, "GPU_DUTY_START", 0.5)])
    svg = budget_chart(series, {"frames": 0.5}, NOW, window_s=600)
    (point,) = re.findall(r"<circle [^>]*data-budget='([^']*)'[^>]*cx='([^']*)'", svg)
    assert point == ("0.5", "44.0")  # at the left edge: the value the window starts at


def test_open_and_recent_ab_runs_link_their_plots() -> None:
    page = render_page(Provider(), NOW)
    tags = parse(page).tags
    assert [a["src"] for t, a in tags if t == "img"] == ["/v1/ab/ab-open/plot", "/v1/ab/ab%2Fold%201/plot"]
    text = " ".join(parse(page).text)
    assert "no slowdown shown" in text and "blocks 3 of 12" in text


def test_the_timeline_lists_recent_events_newest_first() -> None:
    text = " ".join(parse(render_page(Provider(), NOW)).text)
    assert text.index("JOB_PAUSED") < text.index("GPU_DUTY_GROW step") < text.index("GPU_DUTY_BASELINE step")


def test_the_route_serves_it() -> None:
    client = TestClient(create_app(Provider()), base_url="http://127.0.0.1:7807")
    answer = client.get("/")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    assert "PROTECTED_GPU_BUSY" in answer.text and "<svg" in answer.text


class WithSources(Provider):
    def status(self) -> dict[str, Any]:
        s = super().status()
        s["rules"][0]["sources"] = [
            {
                "slot": "progress",
                "kind": "jsonl",
                "readable": True,
                "phase": None,
                "rate": 41.5,
                "read_by": "helper (uid 1000)",
                "needs_helper": False,
                "why": "",
                "latency": {"p50_ms": 0.4, "p99_ms": 1.2, "count": 9},
            },
            {
                "slot": "during.0",
                "kind": "jsonl",
                "readable": False,
                "phase": None,
                "rate": None,
                "read_by": "daemon",
                "needs_helper": False,
                "why": f"no such file {EVIL}",
                "latency": {"count": 0},
            },
        ]
        return s


def section(page: str, name: str) -> str:
    return page.split(f"<section id='{name}'>", 1)[1].split("</section>", 1)[0]


def test_the_sources_show_state_rate_reader_and_latency() -> None:
    page = render_page(WithSources(), NOW)
    text = " ".join(parse(section(page, "sources")).text)
    assert "progress (jsonl)" in text and "41.5" in text and "helper (uid 1000)" in text
    assert "0.4 / 1.2 ms (9)" in text
    assert "cannot be read: no such file" in text and EVIL not in page


class Plain(Provider):
    """A node without gpu_jobs: certified: the governor never runs."""

    def status(self) -> dict[str, Any]:
        return {**super().status(), "gpu_jobs": "when_no_gpu_protected"}

    def duty(self) -> dict[str, Any]:
        return {**super().duty(), "gpu_jobs": "when_no_gpu_protected", "rules": [], "summary": "no governor runs"}

    def timeline(self, limit: int, subject: str | None, code: str | None) -> list[dict[str, Any]]:
        events = [e for e in self.events if not e["code"].startswith("GPU_DUTY")]
        return [e for e in events if (code is None or e["code"] == code) and subject in (None, e["subject"])]


def test_without_certified_the_budget_section_says_why_instead_of_an_empty_chart() -> None:
    budget = section(render_page(Plain(), NOW), "budget")
    assert "<svg" not in budget and "gpu_jobs: when_no_gpu_protected" in budget and "arbiter ab sweep" in budget


def test_a_job_links_to_its_history() -> None:
    page = render_page(Plain(), NOW)
    assert "href='/?subject=j-1#timeline'" in section(page, "jobs")
    alone = section(render_page(Plain(), NOW, subject="j-1"), "timeline")
    assert "JOB_PAUSED" in alone and "only" in alone and "href='/#timeline'" in alone
    assert "JOB_PAUSED" not in section(render_page(Plain(), NOW, subject="someone-else"), "timeline")


class WithShares(Provider):
    """A node whose tenants' GPU share was measured over the last ticks."""

    def status(self) -> dict[str, Any]:
        return {
            **super().status(),
            "gpu_share_history": {
                "window_s": 600.0,
                "t": [NOW - 3, NOW - 2, NOW - 1, NOW],
                "tenants": {"render": [0.5, 0.75, None, 0.25], EVIL: [0.0, 0.0, 0.1, 0.2]},
                "jobs": [0.1, 0.2, 0.3, 0.0],
            },
        }


def test_the_share_chart_draws_each_tenant_and_the_jobs_over_time() -> None:
    shares = section(render_page(WithShares(), NOW), "gpu")
    tags = parse(shares).tags
    assert [t for t, _ in tags].count("svg") == 1
    lines = [a for t, a in tags if t == "polyline"]
    # an unread point breaks render's line in two: one line, then one lone point
    assert sorted(a["data-tenant"] for a in lines) == sorted(["render", EVIL, "jobs"])
    (render,) = [a for a in lines if a["data-tenant"] == "render"]
    assert len(render["points"].split()) == 2
    assert [a["data-tenant"] for t, a in tags if t == "circle"] == ["render"]
    (jobs,) = [a for a in lines if a["data-tenant"] == "jobs"]
    ys = [float(p.split(",")[1]) for p in jobs["points"].split()]
    assert ys[0] > ys[1] > ys[2] < ys[3]  # 10%, 20%, 30% then 0%: higher share, higher on the chart
    text = " ".join(parse(shares).text)
    assert "render 25% now, peak 75%" in text and "jobs 0% now, peak 30%" in text and "4 points" in text
    assert EVIL not in shares and "&lt;script&gt;" in shares


def test_the_share_chart_says_no_data_yet_without_points() -> None:
    for provider in (Provider(), Plain()):
        shares = section(render_page(provider, NOW), "gpu")
        assert "<svg" not in shares and "no data yet" in shares
