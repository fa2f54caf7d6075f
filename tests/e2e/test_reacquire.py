"""The way back, end to end: the shipped vLLM and SGLang rules (through ``extends:``, only
their base_url, match and quiet period change) against fake servers on 127.0.0.1 with the
documented sleep and memory-release endpoints and ``/metrics``, beside the shipped diffusion
server rule.  A render short of VRAM puts the server to sleep; once the render is done and the
quiet period has passed, it is woken (``VRAM_REACQUIRED``) and answers requests again."""

from __future__ import annotations

import shutil
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.tenants import diffusion_rule, http_json, start_diffusion, start_fake

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30

#: rule id → (fake program, match override, a request it serves, what the fake says once asleep)
SERVERS: dict[str, tuple[str, dict[str, Any], tuple[str, dict[str, Any]]]] = {
    "vllm": (
        "vllm",
        {"cmdline": ["arbiter_testing.fake_vllm"]},
        ("/v1/completions", {"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "hi", "max_tokens": 1}),
    ),
    "sglang": (
        "sglang",
        {"module": [], "cmdline": ["fake_llm_servers sglang"]},
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    ),
}


def answered(url: str, request: tuple[str, dict[str, Any]]) -> int:
    try:
        http_json(f"{url}{request[0]}", request[1])
        return 200
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("rid", sorted(SERVERS))
def test_a_server_is_released_for_a_render_and_woken_after_it(tmp_path: Path, rid: str) -> None:
    program, match, request = SERVERS[rid]
    (tmp_path / "vram.json").write_text("{}")
    node = HarnessNode(
        tmp_path, tick_s=0.5, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(tmp_path / "vram.json")}]
    )
    for name in (rid, "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        board = tmp_path / "vram.json"
        server = start_fake(node, board, tmp_path, program, "--held-gb", "13", "--gen-s", "0.3")
        diffusion = start_diffusion(node, board, tmp_path)
        node.add_rule(
            f"my-{rid}",
            {
                "extends": rid,
                "match": match,
                "base_url": server["url"],  # the shipped paths, on the fake's port
                "reacquire_after_s": 1,
            },
        )
        node.add_rule("my-diffusion", diffusion_rule(diffusion))
        node.start()
        assert answered(server["url"], request) == 200
        node.wait_for(lambda: node.known_rule(rid)["vram_bytes"] == 13 * GIB)

        http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})
        run = node.wait_for(lambda: (runs := http_json(f"{diffusion['url']}/debug/runs")) and runs[0], timeout=30)
        assert run["took_s"] < 4, [(e["code"], e["message"]) for e in node.call("timeline", limit=30)["events"]]
        assert node.events("VRAM_RELEASED", subject=rid)
        # it was released through its documented endpoint, and is woken with no request of ours
        woke = node.wait_for(lambda: node.events("VRAM_REACQUIRED", subject=rid), timeout=30)
        asked = node.events("VRAM_REACQUIRE_REQUESTED", subject=rid)
        assert asked and asked[0]["id"] < woke[0]["id"] and woke[0]["data"]["duration_s"] >= 0
        if rid == "vllm":
            assert http_json(f"{server['url']}/is_sleeping") == {"is_sleeping": False}
        assert answered(server["url"], request) == 200
        node.wait_for(lambda: node.known_rule(rid)["vram_bytes"] == 13 * GIB)
        # woken once, not again and again
        assert len(node.events("VRAM_REACQUIRE_REQUESTED", subject=rid)) == 1
    finally:
        node.close()
