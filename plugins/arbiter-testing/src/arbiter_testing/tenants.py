"""Driving the fake tenant servers from a test or a bench: start one beside a node, and
talk JSON to it over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any


def http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    """GET ``url`` (or POST ``body`` as JSON to it) and the JSON answer (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        raw = answer.read()
    return json.loads(raw) if raw else None


def start_fake(
    node: Any, state_file: Path, ready_dir: Path, program: str, *args: str, timeout: float = 30.0
) -> dict[str, Any]:
    """Start the fake ``program`` (``llm``, ``diffusion``, ``vllm``, ``llamacpp``, ``sglang``,
    ``tgi``, ``llama-swap`` or ``localai``) as a child of ``node``
    (a ``HarnessNode``), on a 16 GiB board kept in ``state_file``; what it says once listening
    (``url`` among it), with its process as ``proc``."""
    ready = ready_dir / f"{program}.ready"
    if program == "vllm":
        module = ["arbiter_testing.fake_vllm"]
    elif program in ("llamacpp", "sglang", "tgi"):
        module = ["arbiter_testing.fake_llm_servers", program]
    elif program in ("llama-swap", "localai"):
        module = ["arbiter_testing.fake_model_swappers", program]
    else:
        module = ["arbiter_testing.fake_servers", program]
    proc = node.spawn(
        [
            sys.executable,
            "-m",
            *module,
            "--state-file",
            str(state_file),
            "--ready-file",
            str(ready),
            "--total-gb",
            "16",
            *args,
        ],
        stderr=subprocess.DEVNULL,
    )
    info: dict[str, Any] = node.wait_for(lambda: ready.exists() and json.loads(ready.read_text()), timeout=timeout)
    return {**info, "proc": proc}


def start_diffusion(
    node: Any, state_file: Path, ready_dir: Path, needs_gb: float = 12, fast_s: float = 0.5, starved_s: float = 8
) -> dict[str, Any]:
    """:func:`start_fake` for the fake diffusion server: a 1.6 GB model whose render needs
    ``needs_gb`` more, takes ``fast_s`` with it, and gives up starved after ``starved_s``."""
    return start_fake(
        node,
        state_file,
        ready_dir,
        "diffusion",
        "--model-gb",
        "1.6",
        "--needs-gb",
        f"{needs_gb:g}",
        "--fast-s",
        f"{fast_s:g}",
        "--starved-s",
        f"{starved_s:g}",
    )


def diffusion_rule(diffusion: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The shipped ``diffusion-server`` rule extended for the fake ``diffusion`` (what
    :func:`start_diffusion` answered): matched by its command line, asked at its port.
    ``more``: other fields the extension sets."""
    return {
        "extends": "diffusion-server",
        **more,
        "match": {"script": [], "cmdline": ["fake_servers diffusion"]},
        "base_url": diffusion["url"],
        "events": {"url": diffusion["ws_url"]},
    }
