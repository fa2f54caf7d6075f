"""The fake llama-server's reads, as its source has them: a read of ``/metrics`` empties the
window its throughput gauge is averaged over, for every reader; a read of ``/slots`` changes
nothing; router mode answers both 400 without ``?model=``."""

from __future__ import annotations

from pathlib import Path

import httpx

from arbiter_testing import GIB, VramBoard
from arbiter_testing.fake_llm_servers import FakeLlamaServer


def gauge(page: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in page.splitlines() if line.startswith(f"{name} "))


def test_a_read_of_metrics_resets_the_throughput_and_a_read_of_slots_does_not(tmp_path: Path) -> None:
    with (
        FakeLlamaServer(VramBoard(tmp_path / "vram.json", 24 * GIB), gen_s=0.1) as server,
        httpx.Client(trust_env=False, timeout=10) as client,
    ):
        client.post(f"{server.url}/completion", json={"prompt": "hi", "n_predict": 8})
        for _ in range(3):
            assert [s["is_processing"] for s in client.get(f"{server.url}/slots").json()] == [False] * 4
        first = client.get(f"{server.url}/metrics").text
        assert gauge(first, "llamacpp:predicted_tokens_seconds") == 80.0
        second = client.get(f"{server.url}/metrics").text
        assert gauge(second, "llamacpp:predicted_tokens_seconds") == 0.0  # the window the first read began
        assert gauge(second, "llamacpp:tokens_predicted_total") == 8.0  # counters are not reset


def test_router_mode_answers_slots_and_metrics_400_without_a_model(tmp_path: Path) -> None:
    with FakeLlamaServer(VramBoard(tmp_path / "vram.json", 24 * GIB), router=True) as server:
        for path in ("/slots", "/metrics"):
            assert httpx.get(f"{server.url}{path}", trust_env=False).status_code == 400
            named = httpx.get(f"{server.url}{path}?model={FakeLlamaServer.ROUTER_MODEL}", trust_env=False)
            assert named.status_code == 200
