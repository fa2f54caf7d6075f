"""A tenant's HTTP server that answers its VRAM release with HTTP 500, or never answers.

A protected diffusion server (a fake on 127.0.0.1, shaped like the real API) starts a render
short of VRAM; the plan asks the LLM server to release its model, and that server fails.
VRAM_RELEASE_FAILED names the tenant and the error with a remedy (timeline and ``explain``),
fleet work stays paused while the protected program renders, and nothing else is touched."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil
import pytest

from arbiter_testing.tenants import http_json, start_diffusion, start_fake

from .conftest import Scene

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


@pytest.mark.parametrize("fault", ["500", "hang"])
def test_a_tenant_server_failing_its_release_is_named_and_work_stays_held(scene: Scene, fault: str) -> None:
    for name in ("llm-server", "diffusion-server"):  # the shipped rules, extended as a user would
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", scene.node.tenants / f"{name}.yaml")
    scene.protect()
    scene.start()
    llm = start_fake(
        scene.node, scene.gpu_file, scene.root, "llm", "--model", "mistral:latest=13", "--release-fault", fault
    )
    diffusion = start_diffusion(
        scene.node,
        scene.gpu_file,
        scene.root,
        starved_s=60,
    )
    scene.node.add_rule(
        "my-llm",
        {
            "extends": "llm-server",
            "match": {"name": [], "cmdline": ["fake_servers llm"]},
            "busy": {"url": f"{llm['url']}/api/ps"},
            "release": {"url": f"{llm['url']}/api/generate", "timeout_s": 2},
        },
    )
    scene.node.add_rule(
        "my-diffusion",
        {
            "extends": "diffusion-server",
            "match": {"script": [], "cmdline": ["fake_servers diffusion"]},
            "protect": {"metric": "gpu_share"},
            "busy": {"url": f"{diffusion['url']}/queue"},
            "release": {"url": f"{diffusion['url']}/free"},
            "events": {"url": diffusion["ws_url"]},
        },
    )
    scene.node.call("reload")
    http_json(f"{llm['url']}/api/generate", {"model": "mistral:latest", "prompt": ""})  # loads 13 GB
    scene.node.wait_for(lambda: scene.rule("llm-server")["vram_bytes"] == 13 * GIB, timeout=30)
    scene.run_job("fleet")

    http_json(f"{diffusion['url']}/prompt", {"prompt": {"1": {"class_type": "KSampler"}}})  # a render short of VRAM
    failed = scene.node.events("VRAM_RELEASE_FAILED", subject="llm-server", contains="failed")
    expected = "answered HTTP 500" if fault == "500" else "did not answer within 2s"
    assert any(expected in e["message"] for e in failed), failed
    assert "remedy" in failed[-1]["data"] and "timeout_s" in failed[-1]["data"]["remedy"]
    problem = scene.explained("VRAM_RELEASE_FAILED", "llm-server")
    assert expected in problem["message"] and "release: request" in problem["remedy"]
    scene.held("fleet", "PROTECTED_GPU_BUSY")  # the protected render uses the GPU: fleet work waits
    assert scene.rule("llm-server")["vram_bytes"] == 13 * GIB  # nothing came back, nothing was forced
    scene.assert_alive()
    scene.assert_protected_untouched()
    for server in (llm, diffusion):
        assert server["proc"].poll() is None
        assert psutil.Process(server["proc"].pid).status() != psutil.STATUS_STOPPED
