"""VRAM handoff: arbiter's own share of the time from a tenant becoming starved to its
release confirmed.

    uv run python bench/handoff.py [--rounds 20] [--no-websocket] [--tenant llm|vllm|sglang|all]

Fake LLM and diffusion servers on 127.0.0.1 (shaped like the real programs' APIs) under a
real daemon that uses the shipped rule files through ``extends:``.  Each round loads a 13 GB
model into the LLM server, then queues a render that needs 12 GB: the diffusion server is
starved from that moment.  Measured from the prompt's submission to ``VRAM_RELEASED`` on the
timeline, minus the fake LLM server's own unload time (from its unload starting to its VRAM
gone): what is left is arbiter's share (noticing, planning, asking, confirming).  With the
diffusion server's websocket as a wake-up the goal is under 50 ms; without it, within one
tick of the busy probe.  Also shown: how long the render itself was starved.

With ``--tenant vllm`` or ``sglang`` (or ``all``, the default) the same render takes its VRAM
from a fake vLLM or SGLang server instead (each following its server's source), read through
its Prometheus ``/metrics`` and released through its shipped rule (vLLM's ``/sleep`` with
``mode=wait``; SGLang's memory release, sent only once it is idle); once the render is over,
it is woken (its rule's ``reacquire:``).  Every other round the render starts while a request
of ``--busy-s`` runs on the server.  Shown per server kind: starved → released, idle and busy;
how much longer a busy server took to give its memory back than an idle one (its drain:
SGLang, arbiter's wait for it to be idle; vLLM, the wait inside its ``/sleep``); and idle → reacquired: from the render's end to
``VRAM_REACQUIRED``, and that less the quiet period (``reacquire_after_s``) and the fake's own
wake-up time: arbiter's share of bringing it back.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from arbiter_testing.node import HarnessNode
from arbiter_testing.reaction import percentile as pct
from arbiter_testing.tenants import http_json, start_diffusion, start_fake

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tick", type=float, default=2.0, help="the daemon's tick_s")
    parser.add_argument("--unload-s", type=float, default=0.2, help="the fake LLM server's own unload time")
    parser.add_argument("--no-websocket", action="store_true", help="no events: source (the busy probe polls)")
    parser.add_argument(
        "--tenant", choices=["llm", "vllm", "sglang", "all"], default="all", help="the server kind that gives VRAM up"
    )
    parser.add_argument("--busy-s", type=float, default=1.0, help="vllm, sglang: a busy round's request length")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="vllm, sglang: their reacquire_after_s")
    parser.add_argument("--wake-s", type=float, default=0.2, help="vllm: the fake's own wake-up time")
    args = parser.parse_args(argv)
    if args.tenant in ("llm", "all"):
        llm_rounds(args)
    for kind in SERVERS:
        if args.tenant in (kind, "all"):
            server_rounds(args, kind)
    return 0


def diffusion_rule(diffusion: dict[str, Any], websocket: bool) -> dict[str, Any]:
    return {
        "extends": "diffusion-server",
        "match": {"script": [], "cmdline": ["fake_servers diffusion"]},
        "busy": {"url": f"{diffusion['url']}/queue"},
        "release": {"url": f"{diffusion['url']}/free"},
        "events": {"url": diffusion["ws_url"]} if websocket else None,
    }


def vram_node(prefix: str, tick_s: float, shipped: tuple[str, ...]) -> tuple[Path, HarnessNode]:
    """A node in a new folder whose VRAM is the fake reader's board (``vram.json`` there), with
    the ``shipped`` rule files its rules extend."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    (root / "vram.json").write_text("{}")
    node = HarnessNode(
        root, tick_s=tick_s, stand_in_gpu=False, readers=[{"kind": "fake", "state_file": str(root / "vram.json")}]
    )
    for name in shipped:
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    return root, node


def timeline_after(node: HarnessNode, code: str, before: int) -> Any:
    events = node.call("timeline", code=code, limit=1000)["events"]
    return len(events) > before and events[-1]


def count(node: HarnessNode, code: str) -> int:
    return len(node.call("timeline", code=code, limit=1000)["events"])


def queue_prompt(diffusion: dict[str, Any]) -> None:
    http_json(f"{diffusion['url']}/prompt", {"prompt": {"3": {"class_type": "KSampler"}}})


def nth_run(node: HarnessNode, diffusion: dict[str, Any], i: int) -> Any:
    """The fake diffusion server's ``i``-th run (from 0), once it is done."""
    return node.wait_for(lambda: len(runs := http_json(f"{diffusion['url']}/debug/runs")) > i and runs[i], timeout=30)


def llm_rounds(args: argparse.Namespace) -> None:
    root, node = vram_node("arbiter-bench-handoff-", args.tick, ("llm-server", "diffusion-server"))
    shares, starved, totals, own = [], [], [], []
    try:
        board = root / "vram.json"
        llm = start_fake(node, board, root, "llm", "--model", "mistral:latest=13", "--unload-s", str(args.unload_s))
        diffusion = start_diffusion(node, board, root, fast_s=0.3, starved_s=5)
        node.add_rule(
            "my-llm",
            {
                "extends": "llm-server",
                "match": {"name": [], "cmdline": ["fake_servers llm"]},
                "busy": {"url": f"{llm['url']}/api/ps"},
                "release": {"url": f"{llm['url']}/api/generate"},
            },
        )
        node.add_rule("my-diffusion", diffusion_rule(diffusion, not args.no_websocket))
        node.start()
        offset = time.time() - time.monotonic()  # the fakes' monotonic clock is this machine's
        for i in range(args.rounds):
            http_json(f"{llm['url']}/api/generate", {"model": "mistral:latest", "prompt": ""})
            node.wait_for(
                lambda: next(r for r in node.status()["rules"] if r["id"] == "llm-server")["vram_bytes"] == 13 * GIB,
                timeout=30,
            )
            time.sleep(0.3 + args.tick)  # the probe and the tick have both seen it loaded
            before = count(node, "VRAM_RELEASED")
            queued = time.time()
            queue_prompt(diffusion)
            done = node.wait_for(lambda b=before: timeline_after(node, "VRAM_RELEASED", b), timeout=60)
            unload = http_json(f"{llm['url']}/debug/unloads")[-1]
            run = nth_run(node, diffusion, i)
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


#: server kind → (fake program, match for the fake, a request it serves, its running gauge)
SERVERS: dict[str, tuple[str, dict[str, Any], tuple[str, dict[str, Any]], str]] = {
    "vllm": (
        "vllm",
        {"cmdline": ["arbiter_testing.fake_vllm"]},
        ("/v1/completions", {"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "hi", "max_tokens": 1}),
        "vllm:num_requests_running{",
    ),
    "sglang": (
        "sglang",
        {"cmdline": ["fake_llm_servers sglang"]},
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
        "sglang:num_running_reqs{",
    ),
}


def running(url: str, gauge: str) -> bool:
    """Whether the fake's running gauge reads above zero."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as page:
        lines = page.read().decode().splitlines()
    return any(line.startswith(gauge) and not line.endswith(" 0.0") for line in lines)


def server_rounds(args: argparse.Namespace, kind: str) -> None:
    """Rounds against a server released for the render and woken after it; every other round
    the render starts while a request runs on it, which its rule drains before the release."""
    program, match, request, gauge = SERVERS[kind]
    root, node = vram_node(f"arbiter-bench-handoff-{kind}-", args.tick, (kind, "diffusion-server"))
    released: dict[bool, list[float]] = {False: [], True: []}
    woken, woken_share, drained = [], [], []
    try:
        board = root / "vram.json"
        extra = ["--wake-s", str(args.wake_s)] if kind == "vllm" else []
        server = start_fake(node, board, root, program, "--held-gb", "13", "--gen-s", str(args.busy_s), *extra)
        diffusion = start_diffusion(node, board, root, fast_s=0.3, starved_s=5 + args.busy_s)
        node.add_rule(
            f"my-{kind}",
            {
                "extends": kind,
                "match": match,
                "base_url": server["url"],  # the shipped paths, on the fake's port
                "reacquire_after_s": args.quiet_s,
            },
        )
        node.add_rule("my-diffusion", diffusion_rule(diffusion, not args.no_websocket))
        node.start()
        offset = time.time() - time.monotonic()  # the fakes' monotonic clock is this machine's
        for i in range(args.rounds):
            busy = i % 2 == 1
            node.wait_for(
                lambda: next(r for r in node.status()["rules"] if r["id"] == kind)["vram_bytes"] == 13 * GIB,
                timeout=60,
            )
            time.sleep(0.3 + args.tick)  # the probe and the tick have both seen it awake
            counts = {c: count(node, c) for c in ("VRAM_RELEASED", "VRAM_REACQUIRED")}
            worker = None
            if busy:
                worker = threading.Thread(target=http_json, args=(f"{server['url']}{request[0]}", request[1]))
                worker.start()
                node.wait_for(lambda: running(server["url"], gauge), timeout=10)
            queued = time.time()
            queue_prompt(diffusion)
            rel = node.wait_for(lambda b=counts["VRAM_RELEASED"]: timeline_after(node, "VRAM_RELEASED", b), timeout=60)
            run = nth_run(node, diffusion, i)
            wake = node.wait_for(
                lambda b=counts["VRAM_REACQUIRED"]: timeline_after(node, "VRAM_REACQUIRED", b), timeout=60
            )
            if worker is not None:
                worker.join(timeout=30)
                # the request ran on from the prompt until the server was idle: arbiter waited
                # before asking (SGLang, release_when_busy: wait), or the server drained inside
                # its release (vLLM's mode=wait); either way, until it was asked and its memory fell
                drained.append(1000 * (rel["t"] - queued) - (pct(released[False], 0.5) if released[False] else 0.0))
            ended = run["started_at"] + run["took_s"] + offset
            released[busy].append((rel["t"] - queued) * 1000)
            woken.append((wake["t"] - ended) * 1000)
            wake_s = args.wake_s if kind == "vllm" else 0.2
            woken_share.append((wake["t"] - ended - args.quiet_s - wake_s) * 1000)
            print(
                f"{kind} round {i + 1} ({'busy' if busy else 'idle'}): starved → released {released[busy][-1]:.1f} ms"
                + (f" (drained {drained[-1]:.0f} ms)" if busy else "")
                + f"; render over → reacquired {woken[-1]:.1f} ms",
                flush=True,
            )
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)
    mode = "polling busy probe" if args.no_websocket else "websocket wake-ups"
    print(f"\n{kind}: {mode}, tick {args.tick:g}s, {len(woken)} rounds, busy requests of {args.busy_s:g}s")
    for busy in (False, True):
        figures = released[busy]
        if figures:
            label = "busy" if busy else "idle"
            print(f"starved → released ({label}): p50 {pct(figures, 0.5):.1f} ms, p99 {pct(figures, 0.99):.1f} ms")
    if drained:
        print(
            f"busy drained (beyond idle): p50 {pct(drained, 0.5):.1f} ms, p99 {pct(drained, 0.99):.1f} ms "
            f"(a request of {1000 * args.busy_s:.0f} ms ran when the render came)"
        )
    print(f"idle → reacquired:       p50 {pct(woken, 0.5):.1f} ms, p99 {pct(woken, 0.99):.1f} ms")
    print(f"  arbiter's share:       p50 {pct(woken_share, 0.5):.1f} ms, p99 {pct(woken_share, 0.99):.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
