"""Servers that load models on demand, end to end: the shipped llama-swap and LocalAI rules
(through ``extends:``, only their base_url and match change) against fakes on 127.0.0.1 that
follow their documented APIs, beside the shipped diffusion server rule.  A render short of VRAM
has their loaded models unloaded through the documented endpoint, and runs at full speed; the
next request loads its model again, by itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from arbiter_testing.node import HarnessNode
from arbiter_testing.tenants import diffusion_rule, http_json, start_diffusion, start_fake

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
MODELS = ("qwen2.5-7b", "llama-3.2-3b")  # 6 and 3 GiB in the fakes

#: rule id → (fake program, what lists the loaded models, where its list is)
SERVERS: dict[str, tuple[str, str, str]] = {
    "llama-swap": ("llama-swap", "/running", "running"),
    "localai": ("localai", "/system", "loaded_models"),
}


def chat(url: str, model: str) -> None:
    http_json(f"{url}/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("rid", sorted(SERVERS))
def test_loaded_models_are_unloaded_for_a_render(tmp_path: Path, rid: str) -> None:
    program, listing, key = SERVERS[rid]
    (tmp_path / "vram.json").write_text("{}")
    node = HarnessNode(
        tmp_path, tick_s=0.5, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(tmp_path / "vram.json")}]
    )
    for name in (rid, "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        board = tmp_path / "vram.json"
        server = start_fake(node, board, tmp_path, program, "--gen-s", "0.1")
        diffusion = start_diffusion(node, board, tmp_path, needs_gb=14)
        node.add_rule(
            f"my-{rid}",
            {
                "extends": rid,
                "match": {"name": [], "cmdline": [f"fake_model_swappers {program}"]},
                "base_url": server["url"],
            },
        )
        # as the fake's render: more than is free beside either server
        node.add_rule("my-diffusion", diffusion_rule(diffusion, needs_vram_gb=14))
        node.start()
        for model in MODELS:
            chat(server["url"], model)
        held = 3 * GIB if rid == "llama-swap" else 9 * GIB  # llama-swap swapped the first model out
        node.wait_for(lambda: node.known_rule(rid)["vram_bytes"] == held)

        http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})
        run = node.wait_for(lambda: (runs := http_json(f"{diffusion['url']}/debug/runs")) and runs[0], timeout=30)
        assert run["took_s"] < 4, [(e["code"], e["message"]) for e in node.call("timeline", limit=30)["events"]]
        assert node.events("VRAM_RELEASED", subject=rid)
        assert http_json(f"{server['url']}{listing}")[key] == []
        # no way back to ask for: the next request loads its model again
        chat(server["url"], MODELS[1])
        assert [m.get("model", m.get("id")) for m in http_json(f"{server['url']}{listing}")[key]] == [MODELS[1]]
        node.wait_for(lambda: node.known_rule(rid)["vram_bytes"] == 3 * GIB)
    finally:
        node.close()
