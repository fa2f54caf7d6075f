"""A tenant's GPU profile: applied while it works on the GPU, restored when it stops, and,
after the daemon is killed with ``kill -9``, restored by the next daemon at start-up (its
previous settings were committed before the profile was applied)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from arbiter_testing import write_state
from arbiter_testing.node import HarnessNode


def device(path: Path) -> int:
    return int(json.loads(path.read_text())["power_limit_w"])


def test_a_profile_is_applied_while_the_tenant_works_and_restored_even_after_a_crash(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu.json"
    card = tmp_path / "device.json"
    card.write_text(json.dumps({"power_limit_w": 300}))
    write_state(gpu, {"processes": {}})
    node = HarnessNode(
        tmp_path, stand_in_gpu=False, gpu_release_after_s=1, readers=[{"kind": "fake", "state_file": str(gpu)}]
    )
    try:
        node.add_rule(
            "render",
            {
                "id": "render",
                "match": {"cmdline": ["sleep 1020"]},
                "profile": {"kind": "fake_profile", "device_file": str(card), "power_limit_w": 200},
            },
        )
        node.start()
        renderer = node.spawn(["sleep", "1020"])
        write_state(gpu, {"processes": {str(renderer.pid): {"busy_share": 0.6, "vram_bytes": 1 << 30}}})
        node.wait_for(lambda: device(card) == 200)
        assert node.events("PROFILE_APPLIED", subject="render")
        write_state(gpu, {"processes": {str(renderer.pid): {"busy_share": 0.0, "vram_bytes": 1 << 30}}})
        node.wait_for(lambda: device(card) == 300)  # it stopped working on the GPU
        assert node.events("PROFILE_RESTORED", subject="render")

        write_state(gpu, {"processes": {str(renderer.pid): {"busy_share": 0.6, "vram_bytes": 1 << 30}}})
        node.wait_for(lambda: device(card) == 200)
        assert node.daemon is not None
        node.daemon.send_signal(signal.SIGKILL)  # it dies holding the profile
        node.daemon.wait(10)
        assert device(card) == 200
        write_state(gpu, {"processes": {str(renderer.pid): {"busy_share": 0.0, "vram_bytes": 1 << 30}}})
        node.start()
        node.wait_for(lambda: device(card) == 300)
        assert node.events("PROFILE_RESTORED", contains="a previous daemon left it applied")
    finally:
        node.close()
