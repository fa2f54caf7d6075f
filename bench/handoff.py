"""VRAM handoff: from a tenant becoming starved to its release confirmed, for every shipped
server rule that can give VRAM back, and back again.

    uv run python bench/handoff.py [--rounds 20] [--no-websocket] [--tenant KIND|share|all]

Fake servers on 127.0.0.1 (each following its server's source: see its docstring) under a
real daemon that uses the shipped rule files through ``extends:`` (only base_url, match and
what the rule's comments say to change).  Each round has the server hold its model (13 GB,
or 6 GB for llama-swap and LocalAI), then queues a render that needs 12 GB: the diffusion
server is starved from that moment.  Every other round the render starts while a request of
``--busy-s`` runs on the server.  Shown per server kind (``llm-server``, ``vllm``,
``sglang``, ``llama-server`` in router mode, ``llama-swap``, ``localai``): starved →
released, idle and busy; how much longer a busy server took to give its memory back than an
idle one (its drain: vLLM's ``mode=wait``, LocalAI's wait for the request, SGLang's wait for the request;
llama-swap cuts the request); and, for a rule with a ``reacquire:``, idle → reacquired: from
the render's end to ``VRAM_REACQUIRED``, and that less the quiet period
(``reacquire_after_s``) and the fake's own wake-up time: arbiter's share of bringing it back
(the others load their model again by themselves on their next request).  TGI and a
llama-server with one model have no release: a render short of VRAM finds them blockers.

``--tenant share`` measures arbiter's own share against the Ollama fake alone: from the
prompt's submission to ``VRAM_RELEASED``, minus the fake's own unload time (from its unload
starting to its VRAM gone): noticing, planning, asking, confirming.  With the diffusion
server's websocket as a wake-up the goal is under 50 ms; without it, within one tick of the
busy probe.  Also shown: how long the render itself was starved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
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
        "--tenant", choices=["share", *KINDS, "all"], default="all", help="the server kind that gives VRAM up"
    )
    parser.add_argument("--busy-s", type=float, default=1.0, help="a busy round's request length")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="vllm, sglang: their reacquire_after_s")
    parser.add_argument("--wake-s", type=float, default=0.2, help="vllm: the fake's own wake-up time")
    args = parser.parse_args(argv)
    if args.tenant in ("share", "all"):
        llm_rounds(args)
    table = [server_rounds(args, kind) for kind in KINDS if args.tenant in (kind, "all")]
    if table:
        print(f"\nper server kind (ms; tick {args.tick:g}s, busy requests of {args.busy_s:g}s, {args.rounds} rounds)")
        print(
            "| server | starved → released, idle p50/p99 | busy p50/p99 | busy drained p50/p99 | idle → reacquired p50/p99 |"
        )
        print("|---|---|---|---|---|")
        for row in table:
            print("| " + " | ".join(row) + " |")
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


@dataclass(frozen=True)
class Kind:
    """A server kind: its fake, how the shipped rule is extended for it, and a request it serves."""

    program: str
    args: tuple[str, ...]
    match: dict[str, Any]
    held_gb: float
    request: tuple[str, dict[str, Any]]
    #: its model is loaded by a request (the rule has no reacquire), not woken by arbiter
    loads: bool
    rule: dict[str, Any] = field(default_factory=dict)


CHAT = ("/v1/chat/completions", {"model": "qwen2.5-7b", "messages": [{"role": "user", "content": "hi"}]})
ROUTED = "qwen2.5-7b"

KINDS: dict[str, Kind] = {
    "llm-server": Kind(
        "llm",
        ("--model", "mistral:latest=13", "--unload-s", "0.2"),
        {"name": [], "cmdline": ["fake_servers llm"]},
        13,
        ("/api/generate", {"model": "mistral:latest", "prompt": "hi"}),
        loads=True,
    ),
    "vllm": Kind(
        "vllm",
        ("--held-gb", "13"),
        {"cmdline": ["arbiter_testing.fake_vllm"]},
        13,
        ("/v1/completions", {"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "hi", "max_tokens": 1}),
        loads=False,
    ),
    "sglang": Kind(
        "sglang",
        ("--held-gb", "13"),
        {"cmdline": ["fake_llm_servers sglang"]},
        13,
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
        loads=False,
    ),
    "llama-server": Kind(  # router mode, through the extension its rule's comment documents
        "llamacpp",
        ("--router", "--held-gb", "13"),
        {"name": [], "cmdline": ["fake_llm_servers llamacpp"]},
        13,
        ("/completion", {"model": ROUTED, "prompt": "hi"}),
        loads=True,
        rule={
            "busy": {"url": f"/slots?model={ROUTED}"},
            "release": {"kind": "http_post", "url": "/models/unload", "body": {"model": ROUTED}, "timeout_s": 30},
        },
    ),
    "llama-swap": Kind(
        "llama-swap", (), {"name": [], "cmdline": ["fake_model_swappers llama-swap"]}, 6, CHAT, loads=True
    ),
    "localai": Kind("localai", (), {"name": [], "cmdline": ["fake_model_swappers localai"]}, 6, CHAT, loads=True),
}


def working(board: Path, pid: int) -> bool:
    """Whether the fake with ``pid`` says on the VRAM board that it is working on a request."""
    doc = json.loads(board.read_text() or "{}")
    return float(doc.get("processes", {}).get(str(pid), {}).get("busy_share", 0.0)) > 0


def vram_of(node: HarnessNode, rid: str) -> Any:
    return next(r for r in node.status()["rules"] if r["id"] == rid)["vram_bytes"]


def render_over(node: HarnessNode) -> bool:
    """Whether the diffusion server's probe reads idle: its memory is no longer wanted."""
    rule = next(r for r in node.status()["rules"] if r["id"] == "diffusion-server")
    return bool(rule["sources"]) and rule["sources"][0]["busy"] is False


def serve(url: str, body: dict[str, Any]) -> None:
    """A request whose answer does not matter (llama-swap's is cut by its unload)."""
    with contextlib.suppress(OSError):
        http_json(url, body)


def figures(values: list[float], digits: int = 1) -> str:
    return f"{pct(values, 0.5):.{digits}f} / {pct(values, 0.99):.{digits}f}" if values else "—"


def server_rounds(args: argparse.Namespace, name: str) -> list[str]:
    """Rounds against one server kind released for the render (and woken after it where its
    rule has a reacquire); every other round the render starts while a request runs on it.
    Its row of the summary table."""
    kind = KINDS[name]
    root, node = vram_node(f"arbiter-bench-handoff-{name}-", args.tick, (name, "diffusion-server"))
    released: dict[bool, list[float]] = {False: [], True: []}
    woken, woken_share, drained = [], [], []
    held = int(kind.held_gb * GIB)
    try:
        board = root / "vram.json"
        extra = ["--wake-s", str(args.wake_s)] if name == "vllm" else []
        server = start_fake(node, board, root, kind.program, *kind.args, "--gen-s", str(args.busy_s), *extra)
        diffusion = start_diffusion(node, board, root, fast_s=0.3, starved_s=5 + args.busy_s)
        rule: dict[str, Any] = {"extends": name, "match": kind.match, "base_url": server["url"], **kind.rule}
        if not kind.loads:
            rule["reacquire_after_s"] = args.quiet_s
        node.add_rule(f"my-{name}", rule)
        node.add_rule("my-diffusion", diffusion_rule(diffusion, not args.no_websocket))
        node.start()
        offset = time.time() - time.monotonic()  # the fakes' monotonic clock is this machine's
        url = f"{server['url']}{kind.request[0]}"
        for i in range(args.rounds):
            busy = i % 2 == 1
            node.wait_for(lambda: render_over(node), timeout=60)
            if kind.loads:
                serve(url, kind.request[1])  # loads its model, answers, and keeps it loaded
            node.wait_for(lambda: vram_of(node, name) == held, timeout=60)
            time.sleep(0.3 + args.tick)  # the probe and the tick have both seen it hold its memory
            counts = {c: count(node, c) for c in ("VRAM_RELEASED", "VRAM_REACQUIRED")}
            worker = None
            if busy:  # a request runs on it when the render comes
                worker = threading.Thread(target=serve, args=(url, kind.request[1]))
                worker.start()
                node.wait_for(lambda: working(board, server["pid"]), timeout=30)
            queued = time.time()
            queue_prompt(diffusion)
            rel = node.wait_for(lambda b=counts["VRAM_RELEASED"]: timeline_after(node, "VRAM_RELEASED", b), timeout=60)
            run = nth_run(node, diffusion, i)
            ended = run["started_at"] + run["took_s"] + offset
            released[busy].append((rel["t"] - queued) * 1000)
            if busy:
                # how much longer than an idle release: the server drained its request first
                # (inside its release, or by arbiter's wait), or cut it (nothing to drain)
                drained.append(released[True][-1] - (pct(released[False], 0.5) if released[False] else 0.0))
            line = (
                f"{name} round {i + 1} ({'busy' if busy else 'idle'}): starved → released {released[busy][-1]:.1f} ms"
            )
            if busy:
                line += f" (drained {drained[-1]:.0f} ms)"
            if not kind.loads:
                wake = node.wait_for(
                    lambda b=counts["VRAM_REACQUIRED"]: timeline_after(node, "VRAM_REACQUIRED", b), timeout=60
                )
                woken.append((wake["t"] - ended) * 1000)
                wake_s = args.wake_s if name == "vllm" else 0.2
                woken_share.append((wake["t"] - ended - args.quiet_s - wake_s) * 1000)
                line += f"; render over → reacquired {woken[-1]:.1f} ms"
            if worker is not None:
                worker.join(timeout=60)
            print(line, flush=True)
    finally:
        node.close()
        shutil.rmtree(root, ignore_errors=True)
    mode = "polling busy probe" if args.no_websocket else "websocket wake-ups"
    print(f"\n{name}: {mode}, tick {args.tick:g}s, {args.rounds} rounds, busy requests of {args.busy_s:g}s")
    for busy in (False, True):
        print(f"starved → released ({'busy' if busy else 'idle'}): p50/p99 {figures(released[busy])} ms")
    print(f"busy drained (beyond idle): p50/p99 {figures(drained, 0)} ms")
    if woken:
        print(f"idle → reacquired:       p50/p99 {figures(woken)} ms")
        print(f"  arbiter's share:       p50/p99 {figures(woken_share)} ms")
    again = figures(woken) if woken else "by itself, on its next request"
    return [name, figures(released[False]), figures(released[True]), figures(drained, 0), again]


if __name__ == "__main__":
    sys.exit(main())
