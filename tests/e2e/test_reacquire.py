"""The way back, end to end: the shipped vLLM rule (through ``extends:``, only its base_url,
match and quiet period change) against a fake vLLM server on 127.0.0.1 with the documented sleep mode
and ``/metrics``, beside the shipped diffusion server rule.  A render short of VRAM puts vLLM
to sleep; once the render is done and the quiet period has passed, vLLM is woken
(``VRAM_REACQUIRED``) and answers completions again."""

from __future__ import annotations

import shutil
import urllib.error
from pathlib import Path
from typing import Any

from arbiter.demo.node import LocalNode
from arbiter_testing.tenants import http_json, start_fake

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def completion(url: str) -> tuple[int, Any]:
    try:
        return 200, http_json(f"{url}/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1})
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def tenant(node: LocalNode, rid: str) -> dict[str, Any] | None:
    return next((r for r in node.status()["rules"] if r["id"] == rid), None)


def test_vllm_is_put_to_sleep_for_a_render_and_woken_after_it(tmp_path: Path) -> None:
    (tmp_path / "vram.json").write_text("{}")
    node = LocalNode(
        tmp_path, tick_s=0.5, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(tmp_path / "vram.json")}]
    )
    for name in ("vllm", "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        board = tmp_path / "vram.json"
        vllm = start_fake(node, board, tmp_path, "vllm", "--held-gb", "13", "--gen-s", "0.3")
        diffusion = start_fake(
            node, board, tmp_path, "diffusion", "--model-gb", "1.6", "--needs-gb", "12", "--fast-s", "0.5",
            "--starved-s", "8",
        )  # fmt: skip
        node.add_rule(
            "my-vllm",
            {
                "extends": "vllm",
                "match": {"cmdline": ["arbiter_testing.fake_vllm"]},
                "base_url": vllm["url"],  # the shipped paths, on the fake's port
                "reacquire_after_s": 1,
            },
        )
        node.add_rule(
            "my-diffusion",
            {
                "extends": "diffusion-server",
                "match": {"script": [], "cmdline": ["fake_servers diffusion"]},
                "busy": {"url": f"{diffusion['url']}/queue"},
                "release": {"url": f"{diffusion['url']}/free"},
                "events": {"url": diffusion["ws_url"]},
            },
        )
        node.start()
        assert completion(vllm["url"])[0] == 200
        node.wait_for(lambda: (t := tenant(node, "vllm")) and t["vram_bytes"] == 13 * GIB)

        http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})
        run = node.wait_for(lambda: (runs := http_json(f"{diffusion['url']}/debug/runs")) and runs[0], timeout=30)
        assert run["took_s"] < 4, [(e["code"], e["message"]) for e in node.call("timeline", limit=30)["events"]]
        assert node.events("VRAM_RELEASED", subject="vllm")
        # vLLM went to sleep through its documented endpoint, and is woken with no request of ours
        woke = node.wait_for(lambda: node.events("VRAM_REACQUIRED", subject="vllm"), timeout=30)
        asked = node.events("VRAM_REACQUIRE_REQUESTED", subject="vllm")
        assert asked and asked[0]["id"] < woke[0]["id"] and woke[0]["data"]["duration_s"] >= 0
        assert http_json(f"{vllm['url']}/is_sleeping") == {"is_sleeping": False}
        assert completion(vllm["url"])[0] == 200
        node.wait_for(lambda: (t := tenant(node, "vllm")) and t["vram_bytes"] == 13 * GIB)
        # woken once, not again and again
        assert len(node.events("VRAM_REACQUIRE_REQUESTED", subject="vllm")) == 1
    finally:
        node.close()
