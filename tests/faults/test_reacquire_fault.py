"""A server that fails to wake up.

vLLM (a fake on 127.0.0.1 with the documented sleep mode) is put to sleep for a render short of
VRAM; once the render is over, its ``POST /wake_up`` answers HTTP 500.  VRAM_REACQUIRE_FAILED
names the tenant and the error with a remedy (timeline and ``explain``), the daemon lives, and
the wake is tried again after its backoff: once the server answers, it is woken."""

from __future__ import annotations

import shutil
from pathlib import Path

from arbiter_testing.tenants import diffusion_rule, http_json, start_diffusion, start_fake

from .conftest import Scene

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def test_a_wake_that_fails_is_named_and_tried_again(scene: Scene) -> None:
    for name in ("vllm", "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", scene.node.tenants / f"{name}.yaml")
    scene.protect()
    scene.start()
    vllm = start_fake(scene.node, scene.gpu_file, scene.root, "vllm", "--held-gb", "12", "--wake-fault", "500")
    diffusion = start_diffusion(scene.node, scene.gpu_file, scene.root)
    scene.node.add_rule(
        "my-vllm",
        {
            "extends": "vllm",
            "match": {"cmdline": ["arbiter_testing.fake_vllm"]},
            "base_url": vllm["url"],
            "reacquire_after_s": 0.5,
        },
    )
    scene.node.add_rule("my-diffusion", diffusion_rule(diffusion))
    scene.node.call("reload")
    scene.node.wait_for(lambda: scene.rule("vllm")["vram_bytes"] == 12 * GIB, timeout=30)

    http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})
    failed = scene.node.events("VRAM_REACQUIRE_FAILED", subject="vllm", contains="HTTP 500")
    assert "remedy" in failed[0]["data"] and "reacquire: request" in failed[0]["data"]["remedy"]
    problem = scene.explained("VRAM_REACQUIRE_FAILED", "vllm")
    assert "HTTP 500" in problem["message"] and "backoff" in problem["remedy"]
    assert http_json(f"{vllm['url']}/is_sleeping") == {"is_sleeping": True}
    scene.assert_alive()

    http_json(f"{vllm['url']}/debug/wake_fault", {"fault": ""})  # the server recovers
    woke = scene.node.wait_for(
        lambda: scene.node.call("timeline", code="VRAM_REACQUIRED", subject="vllm")["events"], timeout=60
    )
    tries = scene.node.events("VRAM_REACQUIRE_REQUESTED", subject="vllm")
    assert len(tries) >= 2 and woke[0]["id"] > tries[-1]["id"]
    assert http_json(f"{vllm['url']}/is_sleeping") == {"is_sleeping": False}
    scene.assert_alive()
