"""VRAM handoff: arbiter's own share of the time from a tenant becoming starved to its
release confirmed.

    uv run python bench/handoff.py [--rounds 20] [--no-websocket]

Fake LLM and diffusion servers on 127.0.0.1 (shaped like the real programs' APIs) under a
real daemon that uses the shipped rule files through ``extends:``.  Each round loads a 13 GB
model into the LLM server, then queues a render that needs 12 GB: the diffusion server is
starved from that moment.  Measured from the prompt's submission to ``VRAM_RELEASED`` on the
timeline, minus the fake LLM server's own unload time (from its unload starting to its VRAM
gone): what is left is arbiter's share (noticing, planning, asking, confirming).  With the
diffusion server's websocket as a wake-up the goal is under 50 ms; without it, within one
tick of the busy probe.  Also shown: how long the render itself was starved.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arbiter_testing.node import HarnessNode
from arbiter_testing.reaction import percentile as pct
from arbiter_testing.tenants import http_json, start_fake

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tick", type=float, default=2.0, help="the daemon's tick_s")
    parser.add_argument("--unload-s", type=float, default=0.2, help="the fake LLM server's own unload time")
    parser.add_argument("--no-websocket", action="store_true", help="no events: source (the busy probe polls)")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="arbiter-bench-handoff-"))
    (root / "vram.json").write_text("{}")
    node = HarnessNode(
        root, tick_s=args.tick, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(root / "vram.json")}]
    )
    for name in ("llm-server", "diffusion-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    shares, starved, totals, own = [], [], [], []
    try:
        board = root / "vram.json"
        llm = start_fake(node, board, root, "llm", "--model", "mistral:latest=13", "--unload-s", str(args.unload_s))
        diffusion = start_fake(
            node,
            board,
            root,
            "diffusion",
            "--model-gb",
            "1.6",
            "--needs-gb",
            "12",
            "--fast-s",
            "0.3",
            "--starved-s",
            "5",
        )
        node.add_rule(
            "my-llm",
            {
                "extends": "llm-server",
                "match": {"name": [], "cmdline": ["fake_servers llm"]},
                "busy": {"url": f"{llm['url']}/api/ps"},
                "release": {"url": f"{llm['url']}/api/generate"},
            },
        )
        diffusion_rule: dict[str, Any] = {
            "extends": "diffusion-server",
            "match": {"cmdline": ["fake_servers diffusion"]},
            "busy": {"url": f"{diffusion['url']}/queue"},
            "release": {"url": f"{diffusion['url']}/free"},
            "events": None if args.no_websocket else {"url": diffusion["ws_url"]},
        }
        node.add_rule("my-diffusion", diffusion_rule)
        node.start()
        offset = time.time() - time.monotonic()  # the fakes' monotonic clock is this machine's
        for i in range(args.rounds):
            http_json(f"{llm['url']}/api/generate", {"model": "mistral:latest", "prompt": ""})
            node.wait_for(
                lambda: next(r for r in node.status()["rules"] if r["id"] == "llm-server")["vram_bytes"] == 13 * GIB,
                timeout=30,
            )
            time.sleep(0.3 + args.tick)  # the probe and the tick have both seen it loaded
            before = len(node.call("timeline", code="VRAM_RELEASED", limit=1000)["events"])
            queued = time.time()
            http_json(f"{diffusion['url']}/prompt", {"prompt": {"3": {"class_type": "KSampler"}}})
            done = node.wait_for(
                lambda before=before: (
                    (ev := node.call("timeline", code="VRAM_RELEASED", limit=1000)["events"])
                    and len(ev) > before
                    and ev[-1]
                ),
                timeout=60,
            )
            unload = http_json(f"{llm['url']}/debug/unloads")[-1]
            run = node.wait_for(
                lambda i=i: len(runs := http_json(f"{diffusion['url']}/debug/runs")) > i and runs[i], timeout=30
            )
            total = done["t"] - queued
            totals.append(total * 1000)
            own.append(unload["own_s"] * 1000)
            shares.append((total - unload["own_s"]) * 1000)
            starved.append(run["starved_s"] * 1000)
            print(
                f"round {i + 1}: starved → confirmed {1000 * total:.1f} ms, unload {1000 * unload['own_s']:.1f} ms, "
                f"arbiter {shares[-1]:.1f} ms; render starved {1000 * run['starved_s']:.0f} ms "
                f"(unload started {1000 * (unload['started_at'] + offset - queued):.1f} ms after the prompt)",
                flush=True,
            )
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)
    mode = "polling busy probe" if args.no_websocket else "websocket wake-ups"
    print(f"\n{mode}, tick {args.tick:g}s, {len(shares)} rounds")
    print(f"starved → release confirmed: p50 {pct(totals, 0.5):.1f} ms, p99 {pct(totals, 0.99):.1f} ms")
    print(f"the fake's own unload:       p50 {pct(own, 0.5):.1f} ms")
    print(f"arbiter's share:             p50 {pct(shares, 0.5):.1f} ms, p99 {pct(shares, 0.99):.1f} ms")
    print(f"the render ran starved for:  p50 {pct(starved, 0.5):.0f} ms, p99 {pct(starved, 0.99):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
