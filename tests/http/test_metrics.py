"""/metrics: Prometheus text that prometheus-client's own parser reads, every family documented."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from arbiter.http.metrics import METRICS, exposition
from arbiter_testing.node import PYTHON, HarnessNode
from arbiter_testing.rules import phase_rule

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def full_data() -> dict[str, Any]:
    """A scrape's input with every family given a value."""
    rule = {
        "id": "trainer",
        "running": True,
        "using_gpu": True,
        "gpu_share": 0.62,
        "holds": [{"code": "X"}],
        "vram_bytes": 2 << 30,
        "sources": [
            {"slot": "progress", "kind": "jsonl", "readable": True, "rate": 3.5},
            {"slot": "during.0", "kind": "jsonl", "readable": False, "rate": None},
        ],
    }
    job = {"id": "j-1", "name": "batch", "state": "run"}
    return {
        "status": {
            "version": "9.9",
            "gpu_jobs": "certified",
            "rules": [rule],
            "jobs": [job],
            "vram": {"total_bytes": 8 << 30, "free_bytes": 3 << 30, "jobs_bytes": 1 << 30, "unmanaged_bytes": 0},
            "reader": {"name": "fake_gpu"},
            "recorder": {"failures": 2},
            "scheduler_labels": [
                {"scheduler": "batch", "node": "n1", "labels": ["arbiter-admit", "arbiter-api-cuda"], "error": ""}
            ],
        },
        "duty": {
            "budget": 0.25,
            "ceiling": 0.35,
            "rules": [
                {
                    "rule": "trainer",
                    "budget": 0.25,
                    "ceiling": 0.35,
                    "state": "running",
                    "pressure": 0.01,
                    "baseline": 3.6,
                }
            ],
            "jobs": [{"id": "j-1", "name": "batch", "asked": 0.25, "measured": 0.24}],
        },
        "gpu_apis": {"host": ["cuda", "vulkan"], "containers": ["cuda"]},
        "events": {"JOB_PAUSED": 3, "DAEMON_STARTED": 1},
        "latency": [
            {
                "rule": "trainer",
                "slot": "during.0",
                "kind": "jsonl",
                "buckets": [(0.5, 1), (1.0, 3), (float("inf"), 4)],
                "sum_ms": 9.5,
            }
        ],
        "costs": {"ticks": 10, "tick_cpu_s": 0.05, "decisions": 12, "decide_cpu_s": 0.01, "redecisions": 1},
    }


def parse(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_family_is_exposed_parsed_and_named_by_convention() -> None:
    fams = parse(exposition(full_data()).decode())
    for name, doc in METRICS.items():
        assert name in fams, name
        assert fams[name].type == doc.kind
        assert fams[name].samples, f"{name} has no sample in a full scrape"
        assert re.fullmatch(r"arbiter_[a-z0-9_]+", name) and not name.endswith("_total")
        for sample in fams[name].samples:
            assert set(sample.labels) - {"le"} == set(doc.labels), (name, sample.labels)
    assert "job" not in {label for doc in METRICS.values() for label in doc.labels}  # Prometheus' own target label
    events = {s.labels["code"]: s.value for s in fams["arbiter_timeline_events"].samples if s.name.endswith("_total")}
    assert events == {"DAEMON_STARTED": 1, "JOB_PAUSED": 3}
    hist = {
        s.labels.get("le"): s.value
        for s in fams["arbiter_source_latency_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert hist == {"0.0005": 1, "0.001": 3, "+Inf": 4}
    assert {(s.labels["api"], s.labels["scope"]) for s in fams["arbiter_gpu_api_usable"].samples} == {
        ("cuda", "host"),
        ("vulkan", "host"),
        ("cuda", "containers"),
    }
    told = {
        (s.labels["scheduler"], s.labels["node"], s.labels["label"]) for s in fams["arbiter_scheduler_label"].samples
    }
    assert told == {("batch", "n1", "arbiter-admit"), ("batch", "n1", "arbiter-api-cuda")}


def test_unknown_values_are_absent_not_zero() -> None:
    data = full_data()
    data["status"]["rules"][0].update(gpu_share=None, vram_bytes=None)
    data["duty"] = {
        "budget": None,
        "ceiling": None,
        "rules": [],
        "jobs": [{"id": "j-1", "name": "batch", "asked": 0.0, "measured": None}],
    }
    data["status"]["reader"] = {"name": ""}
    fams = parse(exposition(data).decode())
    assert not fams["arbiter_rule_gpu_share_ratio"].samples
    assert not fams["arbiter_tenant_vram_bytes"].samples
    assert not fams["arbiter_gpu_budget_ratio"].samples
    assert not fams["arbiter_job_duty_measured_ratio"].samples
    assert [(s.labels, s.value) for s in fams["arbiter_gpu_reader_up"].samples] == [({"reader": "none"}, 0.0)]


def test_every_family_is_in_the_docs() -> None:
    text = DOCS.read_text()
    for name in METRICS:
        assert f"`{name}" in text, f"{name} is not in docs/metrics.md"
    documented = set(re.findall(r"`(arbiter_[a-z0-9_]+)", text))
    suffixed = {f"{n}_total" for n, d in METRICS.items() if d.kind == "counter"}
    assert documented <= set(METRICS) | suffixed, (
        f"docs name metrics that do not exist: {documented - set(METRICS) - suffixed}"
    )


def phase(path: Path, value: str) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps({"event": "status", "phase": value}) + "\n")


def test_a_live_daemon_scrape(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    node = HarnessNode(tmp_path)
    try:
        node.add_rule(
            "p",
            phase_rule("p", "sleep 1011", events, on=["busy"], scope=None),
        )
        node.start()
        node.spawn(["sleep", "1011"])
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
        node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
        node.wait_for(lambda: (node.job("plain") or {}).get("pids"), timeout=20)
        phase(events, "busy")
        node.reasons("plain", "PROTECTION_PHASE_ON")
        url = node.info()["http"]

        def scraped() -> dict[str, Metric] | None:
            reply = httpx.get(f"{url}/metrics", timeout=10)
            assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
            fams = parse(reply.text)
            counted = {s.labels["code"] for s in fams["arbiter_timeline_events"].samples}
            return fams if "PROTECTION_PHASE_ON" in counted else None

        fams = node.wait_for(scraped, timeout=10)
        states = {(s.labels["job_name"], s.labels["state"]) for s in fams["arbiter_job_state"].samples}
        assert ("plain", "paused") in states
        readable = {(s.labels["rule"], s.labels["slot"]): s.value for s in fams["arbiter_source_readable"].samples}
        assert readable[("p", "during.0")] == 1
        count = next(
            s.value
            for s in fams["arbiter_source_latency_seconds"].samples
            if s.name.endswith("_count") and s.labels["rule"] == "p"
        )
        assert count >= 1
        assert next(s.value for s in fams["arbiter_ticks"].samples if s.name.endswith("_total")) > 0
        assert next(s.labels for s in fams["arbiter_gpu_reader_up"].samples)["reader"] == "cpu_time"
    finally:
        node.close()
