"""``http_value`` and ``prometheus`` against real HTTP servers on 127.0.0.1: values, booleans
and gauges compared with ``busy_when``, answers of the wrong shape read as unknown with what
was wrong, the byte cap, and corroboration by VRAM as ``http_count`` has it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_sources import HttpValueSource, PrometheusSource
from arbiter_sources.http_count import MAX_ANSWER_BYTES
from arbiter_sources.http_value import parse_comparison, parse_selector
from arbiter_testing import GIB, RecordingServer

METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 2.0
vllm:num_requests_running{engine="1",model_name="llama"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 0.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="qwen"} 1234.0
"""


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5, trust_env=False) as c:
        yield c


def value_probe(tmp_path: Path, clock: Clock | None = None, **options: Any) -> HttpValueSource:
    opts = HttpValueSource.Options.model_validate({"kind": "http_value", **options})
    return HttpValueSource(opts, PluginContext(state_dir=tmp_path), clock=clock or Clock())


def prom_probe(tmp_path: Path, **options: Any) -> PrometheusSource:
    opts = PrometheusSource.Options.model_validate({"kind": "prometheus", **options})
    return PrometheusSource(opts, PluginContext(state_dir=tmp_path))


# --- comparisons and selectors -------------------------------------------------------------


def test_comparisons_parse() -> None:
    assert str(parse_comparison("> 0")) == "> 0"
    assert parse_comparison("==true").literal is True
    assert parse_comparison(">= 2.5").literal == 2.5
    assert parse_comparison("!= 'idle'").literal == "idle"
    assert parse_comparison("== idle").literal == "idle"
    for bad, match in (
        ("0", "does not start with a comparison"),
        ("> ", "nothing to compare"),
        ("> true", "compares numbers"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_comparison(bad)


def test_selectors_parse_with_the_exposition_parser() -> None:
    sel = parse_selector('vllm:num_requests_running{model_name="qwen"}')
    assert sel.name == "vllm:num_requests_running" and sel.labels == (("model_name", "qwen"),)
    assert parse_selector("ollama_up").labels == ()
    for bad in ("", "two words", "# HELP x", "a{b=}"):
        with pytest.raises(ValueError, match="not a metric selector"):
            parse_selector(bad)


def test_options_are_checked() -> None:
    ok = {"kind": "http_value", "url": "http://127.0.0.1:1/x", "field": "running"}
    assert HttpValueSource.Options.model_validate(ok).busy_when == "> 0"
    for bad, match in (
        ({"field": "a..b"}, "dotted field path"),
        ({"field": "*.a.*.b"}, "more than one \\* step"),
        ({"busy_when": "running"}, "does not start with a comparison"),
        ({"url": "file:///x"}, "http:// or https://"),
        ({"vram_floor_gb": -1}, "greater than or equal"),
    ):
        with pytest.raises(ValidationError, match=match):
            HttpValueSource.Options.model_validate({**ok, **bad})
    prom = {"kind": "prometheus", "url": "http://127.0.0.1:1/metrics", "metrics": ["a"]}
    with pytest.raises(ValidationError, match="a sum of samples is a number"):
        PrometheusSource.Options.model_validate({**prom, "busy_when": "== true"})
    with pytest.raises(ValidationError, match="not a metric selector"):
        PrometheusSource.Options.model_validate({**prom, "metrics": ["a b c"]})


# --- http_value ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "options", "busy"),
    [
        ({"running": 0}, {"field": "running"}, False),
        ({"running": 3}, {"field": "running"}, True),
        ({"stats": {"running": 1.5}}, {"field": "stats.running", "busy_when": ">= 2"}, False),
        ({"is_sleeping": True}, {"field": "is_sleeping", "busy_when": "== false"}, False),
        ({"is_sleeping": False}, {"field": "is_sleeping", "busy_when": "== false"}, True),
        ({"status": "idle"}, {"field": "status", "busy_when": "!= idle"}, False),
        ({"status": "generating"}, {"field": "status", "busy_when": "!= idle"}, True),
        # llama-server's GET /slots: one object per slot
        ([{"id": 0, "is_processing": False}] * 2, {"field": "*.is_processing", "busy_when": "== true"}, False),
        (
            [{"is_processing": False}, {"is_processing": True}],
            {"field": "*.is_processing", "busy_when": "== true"},
            True,
        ),
        ({"slots": []}, {"field": "slots.*.is_processing", "busy_when": "== true"}, False),
        ({"slots": [{"n": 2}]}, {"field": "slots.*.n", "busy_when": "> 1"}, True),
    ],
)
def test_a_value_compared(tmp_path: Path, client: httpx.Client, answer: Any, options: Any, busy: bool) -> None:
    with RecordingServer(answer=answer) as server:
        state = value_probe(tmp_path, url=f"{server.url}/status", **options).probe_once(client)
    assert state.readable and state.busy is busy, state.why
    assert "busy when" in state.why


@pytest.mark.parametrize(
    ("answer", "options", "why"),
    [
        ({"running": "2"}, {"field": "running"}, "'running' is a string, expected a number (busy_when > 0)"),
        ({"running": None}, {"field": "running"}, "'running' is null, expected a number"),
        ({"running": True}, {"field": "running"}, "'running' is a boolean, expected a number"),
        ({"is_sleeping": 0}, {"field": "is_sleeping", "busy_when": "== true"}, "is a number, expected a boolean"),
        ({"runing": 0}, {"field": "running"}, "no 'running' (did you mean 'runing'?)"),
        ([1, 2], {"field": "running"}, "no 'running'"),
        ({"slots": 1}, {"field": "slots.*.busy"}, "slots is a number, expected a list"),
        ([{"is_processing": 1}], {"field": "*.is_processing", "busy_when": "== true"}, "'0.is_processing' is a number"),
        ([{"is_processin": True}], {"field": "*.is_processing"}, "no 'is_processing' (did you mean 'is_processin'?)"),
    ],
)
def test_the_wrong_shape_is_unknown_and_says_why(
    tmp_path: Path, client: httpx.Client, answer: Any, options: Any, why: str
) -> None:
    with RecordingServer(answer=answer) as server:
        state = value_probe(tmp_path, url=f"{server.url}/status", **options).probe_once(client)
    assert not state.readable and state.busy is None
    assert why in state.why


def test_not_json_an_error_status_and_too_much_are_unknown(tmp_path: Path, client: httpx.Client) -> None:
    with RecordingServer(answer=b"<html>hi</html>") as server:
        state = value_probe(tmp_path, url=server.url, field="running").probe_once(client)
        assert state.busy is None and "did not answer JSON" in state.why
        server.status, server.answer = 503, {"error": "loading"}
        state = value_probe(tmp_path, url=server.url, field="running").probe_once(client)
        assert state.busy is None and "HTTP 503" in state.why
        server.status, server.answer = 200, {"running": 0, "pad": "x" * MAX_ANSWER_BYTES}
        state = value_probe(tmp_path, url=server.url, field="running").probe_once(client)
        assert state.busy is None and "more than the" in state.why


def test_a_claim_below_the_vram_floor_goes_stale(tmp_path: Path, client: httpx.Client) -> None:
    clock = Clock()
    with RecordingServer(answer={"running": 1}) as server:
        probe = value_probe(tmp_path, clock, url=server.url, field="running", vram_floor_gb=2, stale_after_s=30)
        probe.tenant_vram(GIB // 2)
        assert probe.probe_once(client).busy is True  # suspect, not yet stale
        clock.t += 31
        state = probe.probe_once(client)
        assert state.busy is False and "stale" in state.why
        probe.tenant_vram(3 * GIB)  # it holds the floor: believed again
        assert probe.state().busy is True


# --- prometheus ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "busy_when", "busy", "shown"),
    [
        (["vllm:num_requests_running"], "> 0", True, "is 3"),
        (['vllm:num_requests_running{model_name="qwen"}'], "> 2", False, "is 2"),
        (["vllm:num_requests_running", "vllm:num_requests_waiting"], ">= 3", True, "is 3"),
        (["vllm:num_requests_waiting"], "> 0", False, "is 0"),
        (["vllm:prompt_tokens_total"], "> 1000", True, "is 1234"),
    ],
)
def test_gauges_summed_and_compared(
    tmp_path: Path, client: httpx.Client, metrics: list[str], busy_when: str, busy: bool, shown: str
) -> None:
    with RecordingServer(answer=METRICS) as server:
        state = prom_probe(tmp_path, url=f"{server.url}/metrics", metrics=metrics, busy_when=busy_when).probe_once(
            client
        )
    assert state.readable and state.busy is busy and shown in state.why, state.why


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        (["vllm:num_request_running"], "no sample of 'vllm:num_request_running' in the answer (did you mean"),
        (['vllm:num_requests_running{model_name="x"}'], "with those labels"),
    ],
)
def test_a_missing_metric_is_unknown(tmp_path: Path, client: httpx.Client, metrics: list[str], why: str) -> None:
    with RecordingServer(answer=METRICS) as server:
        state = prom_probe(tmp_path, url=f"{server.url}/metrics", metrics=metrics).probe_once(client)
    assert state.busy is None and why in state.why, state.why


def test_not_the_text_format_is_unknown(tmp_path: Path, client: httpx.Client) -> None:
    with RecordingServer(answer=b"this is not { a metrics page\n") as server:
        state = prom_probe(tmp_path, url=f"{server.url}/metrics", metrics=["up"]).probe_once(client)
    assert state.busy is None and "Prometheus text format" in state.why, state.why
