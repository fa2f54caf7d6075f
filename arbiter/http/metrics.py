"""Prometheus exposition of a node: built at each scrape from the daemon's published views, in a
registry of its own (no process-wide default registry, no state between scrapes)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric


@dataclass(frozen=True)
class MetricDoc:
    kind: str  # gauge, counter or histogram
    labels: tuple[str, ...]
    help: str


#: every family /metrics exposes (counters without their ``_total``); docs/metrics.md lists each
METRICS: dict[str, MetricDoc] = {
    "arbiter_info": MetricDoc("gauge", ("version", "gpu_jobs"), "Always 1; the version and the gpu_jobs setting."),
    "arbiter_gpu_budget_ratio": MetricDoc(
        "gauge", (), "The node's GPU budget for cooperative jobs (the lowest over rules; 0 while taken back)."
    ),
    "arbiter_gpu_budget_ceiling_ratio": MetricDoc(
        "gauge", (), "The lowest ceiling (certified duty) over the rules whose governor runs."
    ),
    "arbiter_rule_budget_ratio": MetricDoc("gauge", ("rule",), "The budget the rule's governor allows now."),
    "arbiter_rule_ceiling_ratio": MetricDoc("gauge", ("rule",), "The rule's ceiling, from its certificate."),
    "arbiter_rule_governor_state": MetricDoc(
        "gauge", ("rule", "state"), "1 for the governor's state: baseline, running, taken back or off."
    ),
    "arbiter_rule_pressure_ratio": MetricDoc("gauge", ("rule",), "1 - rate/baseline at the governor's last decision."),
    "arbiter_rule_baseline_progress_per_second": MetricDoc(
        "gauge", ("rule",), "The progress rate measured with GPU work held."
    ),
    "arbiter_rule_progress_per_second": MetricDoc(
        "gauge", ("rule",), "The progress rate the rule's progress source reads now."
    ),
    "arbiter_rule_running": MetricDoc("gauge", ("rule",), "1 while the rule's program runs."),
    "arbiter_rule_using_gpu": MetricDoc("gauge", ("rule",), "1 while the rule's program counts as using the GPU."),
    "arbiter_rule_gpu_share_ratio": MetricDoc(
        "gauge", ("rule",), "The program's share of GPU time over the last tick (absent when unreadable)."
    ),
    "arbiter_rule_holds": MetricDoc("gauge", ("rule",), "How many reasons the rule holds GPU work back for now."),
    "arbiter_source_readable": MetricDoc(
        "gauge", ("rule", "slot", "kind"), "1 while the source reads; 0 counts against fleet work."
    ),
    "arbiter_source_latency_seconds": MetricDoc(
        "histogram", ("rule", "slot", "kind"), "From a source seeing a change to the decision it caused."
    ),
    "arbiter_job_duty_asked_ratio": MetricDoc("gauge", ("job_id", "job_name"), "The GPU duty the job is told to hold."),
    "arbiter_job_duty_measured_ratio": MetricDoc(
        "gauge", ("job_id", "job_name"), "The job's share of GPU time as the reader measures it."
    ),
    "arbiter_job_state": MetricDoc(
        "gauge", ("job_id", "job_name", "state"), "1 for the job's state (run, held, paused, stopping...)."
    ),
    "arbiter_tenant_vram_bytes": MetricDoc(
        "gauge", ("rule",), "VRAM the rule's program holds (absent when unreadable)."
    ),
    "arbiter_vram_total_bytes": MetricDoc("gauge", (), "The device's VRAM."),
    "arbiter_vram_free_bytes": MetricDoc("gauge", (), "The device's free VRAM."),
    "arbiter_vram_jobs_bytes": MetricDoc("gauge", (), "VRAM held by fleet jobs' processes."),
    "arbiter_vram_unmanaged_bytes": MetricDoc("gauge", (), "VRAM in use that no rule or job claims."),
    "arbiter_gpu_reader_up": MetricDoc(
        "gauge", ("reader",), '1 while a reader reads per-process GPU time; 0 (reader "none") when none can.'
    ),
    "arbiter_gpu_api_usable": MetricDoc(
        "gauge", ("api", "scope"), "1 for each GPU API the probes found usable, on the host or in containers."
    ),
    "arbiter_scheduler_label": MetricDoc(
        "gauge",
        ("scheduler", "node", "label"),
        "1 for each label (a node feature) a fleet scheduler is told this node has.",
    ),
    "arbiter_timeline_events": MetricDoc(
        "counter", ("code",), "Timeline events recorded since the daemon started, by code."
    ),
    "arbiter_ticks": MetricDoc("counter", (), "Ticks (process scans and readings) since start."),
    "arbiter_tick_cpu_seconds": MetricDoc(
        "counter",
        (),
        "CPU time of the tick thread and of the plugin calls it made, their child workers' included (not the source watchers').",
    ),
    "arbiter_decisions": MetricDoc("counter", (), "Decisions taken since start."),
    "arbiter_decision_cpu_seconds": MetricDoc(
        "counter", (), "CPU time of the decision thread (taking reports too) and of the plugin calls it made."
    ),
    "arbiter_redecisions": MetricDoc(
        "counter",
        (),
        "Decisions made again because the reflex process acted on, or read, a phase change while they were being made.",
    ),
    "arbiter_recording_failures": MetricDoc(
        "counter", (), "Batches the state store could not write (disk full or read-only)."
    ),
}


class _Families:
    """Metric families being filled, created from METRICS so the table is the only place names
    and labels are spelled."""

    def __init__(self) -> None:
        self.made: dict[str, Metric] = {}

    def __call__(self, name: str) -> Any:
        if name not in self.made:
            doc = METRICS[name]
            cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[
                doc.kind
            ]
            self.made[name] = cls(name, doc.help, labels=list(doc.labels))
        return self.made[name]

    def set(self, name: str, value: float | None, *labels: str) -> None:
        if value is not None:
            self(name).add_metric(list(labels), float(value))


def families(data: dict[str, Any]) -> Iterator[Metric]:
    """The families for one scrape of ``data`` (what ``Provider.metrics`` returns)."""
    status, duty = data["status"], data["duty"]
    f = _Families()
    f.set("arbiter_info", 1, status.get("version", ""), status.get("gpu_jobs", ""))
    f.set("arbiter_gpu_budget_ratio", duty.get("budget"))
    f.set("arbiter_gpu_budget_ceiling_ratio", duty.get("ceiling"))
    for g in duty.get("rules", []):
        rid = g["rule"]
        f.set("arbiter_rule_budget_ratio", g["budget"], rid)
        f.set("arbiter_rule_ceiling_ratio", g["ceiling"], rid)
        f.set("arbiter_rule_governor_state", 1, rid, g["state"])
        f.set("arbiter_rule_pressure_ratio", g["pressure"], rid)
        f.set("arbiter_rule_baseline_progress_per_second", g["baseline"], rid)
    for rule in status.get("rules", []):
        rid = rule["id"]
        f.set("arbiter_rule_running", int(rule["running"]), rid)
        f.set("arbiter_rule_using_gpu", int(rule["using_gpu"]), rid)
        f.set("arbiter_rule_gpu_share_ratio", rule["gpu_share"], rid)
        f.set("arbiter_rule_holds", len(rule["holds"]), rid)
        f.set("arbiter_tenant_vram_bytes", rule["vram_bytes"], rid)
        for src in rule["sources"]:
            f.set("arbiter_source_readable", int(src["readable"]), rid, src["slot"], src["kind"])
            if src["slot"] == "progress":
                f.set("arbiter_rule_progress_per_second", src["rate"], rid)
    for h in data.get("latency", []):
        buckets = [(_le(bound), count) for bound, count in h["buckets"]]
        f("arbiter_source_latency_seconds").add_metric([h["rule"], h["slot"], h["kind"]], buckets, h["sum_ms"] / 1000)
    for job in duty.get("jobs", []):
        f.set("arbiter_job_duty_asked_ratio", job["asked"], job["id"], job["name"])
        f.set("arbiter_job_duty_measured_ratio", job["measured"], job["id"], job["name"])
    for job in status.get("jobs", []):
        f.set("arbiter_job_state", 1, job["id"], job["name"], job["state"])
    vram = status.get("vram", {})
    for key in ("total", "free", "jobs", "unmanaged"):
        f.set(f"arbiter_vram_{key}_bytes", vram.get(f"{key}_bytes"))
    reader = status.get("reader", {})
    f.set("arbiter_gpu_reader_up", 1 if reader.get("name") else 0, reader.get("name") or "none")
    apis = data.get("gpu_apis") or {}
    for scope in ("host", "containers"):
        for api in apis.get(scope) or []:
            f.set("arbiter_gpu_api_usable", 1, api, scope)
    for told in status.get("scheduler_labels", []):
        for label in told["labels"]:
            f.set("arbiter_scheduler_label", 1, told["scheduler"], told["node"], label)
    for code, n in sorted(data.get("events", {}).items()):
        f.set("arbiter_timeline_events", n, code)
    costs = data.get("costs", {})
    f.set("arbiter_ticks", costs.get("ticks"))
    f.set("arbiter_tick_cpu_seconds", costs.get("tick_cpu_s"))
    f.set("arbiter_decisions", costs.get("decisions"))
    f.set("arbiter_decision_cpu_seconds", costs.get("decide_cpu_s"))
    f.set("arbiter_redecisions", costs.get("redecisions"))
    f.set("arbiter_recording_failures", status.get("recorder", {}).get("failures"))
    # a family with no sample still says it exists (and what it means) to whoever scrapes
    for name in METRICS:
        f(name)
    yield from f.made.values()


def _le(bound_ms: float) -> str:
    return "+Inf" if bound_ms == float("inf") else repr(bound_ms / 1000)


class _Scrape:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def collect(self) -> Iterator[Metric]:
        return families(self.data)


def exposition(data: dict[str, Any]) -> bytes:
    """The text format Prometheus scrapes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(data))
    return generate_latest(registry)
