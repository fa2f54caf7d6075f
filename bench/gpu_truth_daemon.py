"""The parts of ``gpu_truth.py`` that run a real daemon beside real GPU programs.

- ``handoff``: the model server (arbiter_testing.model_server) holds N GiB of device memory
  under the shipped ``llm-server`` rule; a demander that ranks above it starts using the GPU
  with ``needs_vram_gb`` more than is free.  Measured: the demander seen → the plan, the
  request → ``VRAM_RELEASED`` confirmed by the readers, less the server's own unload time.
  Then a job holds N GiB under a daemon whose pause translator is ``cuda_checkpoint``, and a
  second demander takes that memory by pausing it: plan, checkpoint, release confirmed, and
  the restore once the demander has ended.
- ``protected``: a seeded training loop (its steps on a JSON-lines events file, its bar by
  tqdm) is the protected program, a cooperative job beside it; ``ab start`` with short
  windows earns (or refuses) a certificate, then the governor runs and the program's
  slowdown is measured against its target.  About four minutes on a GPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.demo.node import LocalNode

if TYPE_CHECKING:
    from gpu_truth import Figures, Rig

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "gpu_truth_work.py"


def _node(rig: Rig, name: str, **config: Any) -> LocalNode:
    root = rig.out / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    readers: list[Any] = (
        [{"kind": "fake", "state_file": str(rig.board), "cuda_dir": str(rig.cuda_dir)}] if rig.dry else ["nvml"]
    )
    return LocalNode(root, readers=readers, stand_in_gpu=False, **config)


def _env(rig: Rig, node: LocalNode) -> dict[str, str]:
    return {**rig.env, "ARBITER_CONFIG": str(node.config_path), "PYTHONUNBUFFERED": "1"}


def _first(node: LocalNode, code: str, subject: str | None = None, timeout: float = 60) -> dict[str, Any]:
    found = node.wait_for(
        lambda: [e for e in node.call("timeline", code=code, subject=subject, limit=500)["events"]],
        timeout=timeout,
    )
    return dict(found[0])


def part_handoff(rig: Rig, quick: bool, gib: float) -> Figures:
    node = _node(
        rig,
        "handoff",
        tick_s=0.5,
        translators={"pause": ["cuda_checkpoint"], "terminate": ["cuda_checkpoint"]},
        plugin_timeout_s=120,
    )
    try:
        free = rig.free_bytes()
        hold_gib = round(min(gib, 0.6 * free / GIB), 2)
        # starved while the server holds its memory, not once it has given half of it back
        need_gib = round((free - hold_gib * GIB / 2) / GIB, 2)
        # the same for the job of the second half (the server's context may stay behind)
        job_need_gib = round((free - hold_gib * GIB / 4) / GIB, 2)
        server = node.spawn(
            [
                sys.executable,
                "-m",
                "arbiter_testing.model_server",
                "--gib",
                str(hold_gib),
                "--load",
                *(["--board", str(rig.board), "--total-gib", str(rig.total / GIB)] if rig.dry else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=_env(rig, node),
        )
        assert server.stdout is not None
        said = json.loads(server.stdout.readline())
        shutil.copy(ROOT / "tenants.d" / "llm-server.yaml", node.tenants / "llm-server.yaml")
        node.add_rule(
            "gt-llm",
            {
                "extends": "llm-server",
                "match": {"name": [], "cmdline": ["arbiter_testing.model_server"]},
                "busy": {"url": f"{said['url']}/api/ps"},
                "release": {"url": f"{said['url']}/api/generate"},
            },
        )
        marker = f"--tag {node.root} duty --duty 0.5 --unit-ms 5 --seconds 120"
        node.add_rule(
            "gt-demander",
            {"id": "gt-demander", "priority": 80, "match": {"cmdline": [marker]}, "needs_vram_gb": need_gib},
        )
        job_marker = f"--tag {node.root} duty --duty 0.5 --unit-ms 5 --seconds 121"
        node.add_rule(
            "gt-demander2",
            {"id": "gt-demander2", "priority": 80, "match": {"cmdline": [job_marker]}, "needs_vram_gb": job_need_gib},
        )
        node.start(
            60.0, **{k: v for k, v in rig.env.items() if k.startswith(("FAKE_CUDA", "GPU_TRUTH", "LD_LIBRARY_PATH"))}
        )
        node.wait_for(
            lambda: (
                next(r for r in node.status()["rules"] if r["id"] == "llm-server")["vram_bytes"] >= 0.9 * hold_gib * GIB
            ),
            timeout=60,
        )
        started = time.time()
        demander = node.spawn(
            [sys.executable, str(WORK), *(["--dry"] if rig.dry else []), *marker.split()],
            stdout=subprocess.DEVNULL,
            env=_env(rig, node),
        )
        released = _first(node, "VRAM_RELEASED", "llm-server", timeout=120)
        planned = _first(node, "VRAM_HANDOFF_PLANNED", "gt-demander")
        asked = _first(node, "VRAM_RELEASE_REQUESTED", "llm-server")
        unloads = json.loads(_get(f"{said['url']}/debug/unloads"))
        own = unloads[-1]["done_at"] - unloads[-1]["asked_at"] if unloads else 0.0
        duration = float(released["data"].get("duration_s", released["t"] - asked["t"]))
        figures: Figures = {
            "held_gib": hold_gib,
            "needs_gib": need_gib,
            "seen_to_plan_s": round(planned["t"] - started, 3),
            "request_to_confirmed_s": round(duration, 3),
            "server_unload_s": round(own, 3),
            "arbiter_share_s": round(duration - own, 3),
            "freed_bytes": released["data"].get("freed_bytes"),
        }
        figures["lines"] = [
            f"model server holding {hold_gib:g} GiB; a demander ranked above it needs {need_gib:g} GiB",
            f"demander started → plan logged: {figures['seen_to_plan_s']:.2f}s (its GPU use must first be seen: "
            f"gpu_busy_threshold over a tick of {node.config['tick_s']}s)",
            f"release asked → VRAM_RELEASED confirmed by the readers: {duration:.3f}s, of which the server's own "
            f"unload {own:.3f}s: arbiter's share {duration - own:.3f}s",
            f"freed: {(released['data'].get('freed_bytes') or 0) / GIB:.2f} GiB",
        ]
        demander.kill()
        demander.wait(30)
        figures.update(_job_handoff(rig, node, hold_gib, job_need_gib, job_marker))
        figures["lines"] += figures.pop("job_lines")
        return figures
    finally:
        _keep_timeline(node)
        node.close()


def _job_handoff(rig: Rig, node: LocalNode, hold_gib: float, need_gib: float, marker: str) -> Figures:
    """A job holding N GiB, paused by ``cuda_checkpoint`` for a demander short of VRAM."""
    dry = ["--dry"] if rig.dry else []
    before = rig.free_bytes()
    node.job_run(
        [sys.executable, str(WORK), *dry, "hold", "--gib", str(hold_gib)],
        "--name",
        "gt-hold",
        stdout=subprocess.DEVNULL,
        env=_env(rig, node),
    )
    _until(lambda: rig.free_bytes() <= before - 0.9 * hold_gib * GIB, 120, "the job holding its memory")
    job_id = node.job("gt-hold")["id"]  # type: ignore[index]
    started = time.time()
    demander = node.spawn(
        [sys.executable, str(WORK), *dry, *marker.split()], stdout=subprocess.DEVNULL, env=_env(rig, node)
    )
    released = _first(node, "VRAM_RELEASED", job_id, timeout=180)
    checkpointed = _first(node, "GPU_MEMORY_CHECKPOINTED", job_id)
    planned = _first(node, "VRAM_HANDOFF_PLANNED", "gt-demander2")
    demander.kill()
    demander.wait(30)
    restored = _first(node, "GPU_MEMORY_RESTORED", job_id, timeout=120)
    return {
        "job_held_gib": hold_gib,
        "job_seen_to_plan_s": round(planned["t"] - started, 3),
        "job_request_to_confirmed_s": released["data"].get("duration_s"),
        "job_checkpoint_s": checkpointed["data"].get("seconds"),
        "job_restore_s": restored["data"].get("seconds"),
        "job_lines": [
            f"a job holding {hold_gib:g} GiB, a demander needing {need_gib:g} GiB, the pause translator "
            "cuda_checkpoint: demander started → plan "
            f"{planned['t'] - started:.2f}s; its pause → VRAM_RELEASED {released['data'].get('duration_s')}s "
            f"(the checkpoint itself {checkpointed['data'].get('seconds')}s); freed "
            f"{(released['data'].get('freed_bytes') or 0) / GIB:.2f} GiB; restored after the demander ended in "
            f"{restored['data'].get('seconds')}s",
        ],
    }


def _keep_timeline(node: LocalNode) -> None:
    """What the daemon did and saw, beside the results: a failed part is read from it."""
    try:
        events = node.call("timeline", limit=2000)["events"]
        status = node.status()
    except Exception:  # the daemon is gone: its log is in the same folder
        return
    (node.root / "timeline.json").write_text(json.dumps({"events": events, "status": status}, indent=1, default=str))


def _until(predicate: Any, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout_s:g}s for {what}")
        time.sleep(0.1)


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def _rate(events: Path, since: float, until: float) -> float | None:
    """Steps per second the protected program logged between two wall times."""
    try:
        times = [json.loads(line)["t"] for line in events.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, KeyError):
        return None
    inside = [t for t in times if since <= t <= until]
    return len(inside) / (until - since) if until > since and inside else None


def part_protected(rig: Rig, quick: bool) -> Figures:
    window, washout, blocks, governed_s = (3, 1, 4, 12) if quick else (15, 3, 4, 45)
    node = _node(
        rig,
        "protected",
        tick_s=0.25,
        gpu_jobs="certified",
        governor={"period_s": 2, "baseline_s": 4, "rebaseline_s": 600, "take_back_s": 5, "grow_step": 0.05},
    )
    events = node.root / "progress.jsonl"
    manifest = node.root / "gt-coop.yaml"
    manifest.write_text("name: gt-coop\ncapabilities: [cooperative_throttle, cooperative_pause]\ngpu: {use: shared}\n")
    try:
        node.add_rule(
            "gt-trainer",
            {
                "id": "gt-trainer",
                "match": {"cmdline": [f"--events {events}"]},
                "protect": {
                    "source": {"kind": "jsonl", "path": str(events), "event": "step_done"},
                    "max_slowdown": 0.05,
                },
            },
        )
        node.start(
            60.0, **{k: v for k, v in rig.env.items() if k.startswith(("FAKE_CUDA", "GPU_TRUTH", "LD_LIBRARY_PATH"))}
        )
        dry = ["--dry"] if rig.dry else []
        node.spawn(
            [
                sys.executable,
                str(WORK),
                *dry,
                "train",
                "--steps",
                "100000000",
                "--step-ms",
                "5",
                "--events",
                str(events),
            ]
            + ([] if rig.dry else ["--progress", str(node.root / "tqdm.txt")]),
            stdout=subprocess.DEVNULL,
            env=_env(rig, node),
        )
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=60)
        node.job_run(
            [sys.executable, str(WORK), *dry, "duty", "--duty", "1", "--unit-ms", "5", "--seconds", "100000"],
            "--manifest",
            str(manifest),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_env(rig, node),
        )
        node.wait_for(lambda: node.job("gt-coop"), timeout=60)
        node.wait_for(lambda: node.status()["rules"][0]["sources"][0]["rate"], timeout=60)
        plan = node.call(
            "ab.start",
            rule="gt-trainer",
            work="gt-coop",
            duty=0.5,
            blocks=blocks,
            window=window,
            washout=washout,
            margin=0.05,
            off="paused",
            max_hours=1,
        )["plan"]
        run_id = plan["run"]
        run = node.wait_for(
            lambda: (
                (r := next(x for x in node.call("ab.status")["runs"] if x["run"] == run_id))["status"] != "running"
                and r
            ),
            timeout=blocks * 2 * (window + washout) * 3 + 120,
        )
        report = node.call("ab.show", id=run_id)["report"]
        analysis = report.get("analysis") or {}
        figures: Figures = {
            "run": run_id,
            "status": run["status"],
            "verdict": run.get("verdict"),
            "why": run.get("why"),
            "certifies": report.get("certifies"),
            "analysis": analysis,
            "blocks_done": run.get("blocks_done"),
        }
        interval = (
            f"R {analysis['r']:.4f} (90 % {analysis['low']:.4f}–{analysis['high']:.4f})" if "r" in analysis else "no R"
        )
        lines = [
            f"A/B run {run_id}: {blocks} blocks of {window}s ON/OFF windows (washout {washout}s), duty 0.5: "
            f"{run['status']} after {run.get('blocks_done')} block(s), verdict {run.get('verdict') or 'none'}, "
            f"{interval}, certifies: {report.get('certifies')}" + (f"; {run['why']}" if run.get("why") else "")
        ]
        certs = node.call("certificates")["certificates"]
        if any(c["status"] == "valid" for c in certs):
            running = node.wait_for(
                lambda: (d := node.call("duty")["duty"])["rules"] and d["rules"][0]["state"] == "running" and d,
                timeout=60,
            )
            began = time.time()
            time.sleep(governed_s)
            last = node.call("duty")["duty"]
            baseline = _rate(events, began - governed_s - 5, began - 5)
            governed = _rate(events, began, time.time())
            slowdown = None if not baseline or not governed else 1 - governed / baseline
            figures.update(governor_summary=last["summary"], slowdown=slowdown, budget=last["budget"])
            lines += [
                f"governor: {running['summary']} → after {governed_s}s {last['summary']}",
                "the program's steps/s under the governor against the target max_slowdown 0.05: "
                + ("unreadable" if slowdown is None else f"slowdown {100 * slowdown:.1f} %"),
            ]
        else:
            lines.append("no certificate was earned, so the governor did not run (work waits: GPU_NOT_CERTIFIED)")
        figures["lines"] = lines
        return figures
    finally:
        _keep_timeline(node)
        node.close()
