"""Who owns a process, through a real daemon with the shipped llama-swap and llama-server
rules: llama-swap's llama-server child is llama-swap's (status and explain say so), while a
llama-server started by itself stays the llama-server rule's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

from arbiter_testing.node import HarnessNode

ROOT = Path(__file__).resolve().parents[2]


def test_a_proxys_server_goes_with_the_proxy_and_explain_names_the_owner(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a process's name is its executable's: a copy of sleep named as the server, and a script
    # named as the proxy that starts one
    shutil.copy(shutil.which("sleep") or "/bin/sleep", bin_dir / "llama-server")
    proxy = bin_dir / "llama-swap"
    kid_file = tmp_path / "kid.pid"
    proxy.write_text(f"#!/bin/sh\n{bin_dir / 'llama-server'} 300 &\necho $! > {kid_file}\nwait\n")
    proxy.chmod(0o755)
    node = HarnessNode(tmp_path)
    for name in ("llama-swap", "llama-server"):
        shutil.copy(ROOT / "tenants.d" / f"{name}.yaml", node.tenants / f"{name}.yaml")
    try:
        node.start()
        swap = node.spawn([str(proxy)])
        alone = node.spawn([str(bin_dir / "llama-server"), "300"])
        # the proxy's start brings a tick forward, which may come before the lone server's
        owned = node.wait_for(
            lambda: (
                node.known_rule("llama-server")["pids"] == [alone.pid]
                and len(pids := node.known_rule("llama-swap")["pids"]) == 2
                and pids
            ),
            timeout=30,
        )
        child = next(p for p in owned if p != swap.pid)
        assert node.known_rule("llama-swap")["from_trees"] == {str(child): "llama-server"}
        said = node.call("explain", subject=str(child))["explain"]
        assert [i["id"] for i in said["items"]] == ["llama-swap"]
        shown = node.cli("explain", str(child))
        assert "owns process" in shown.stdout and "'llama-server' also selects" in shown.stdout
    finally:
        if kid_file.exists():  # the proxy's child outlives the proxy's own end
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(kid_file.read_text()), signal.SIGKILL)
        node.close()
