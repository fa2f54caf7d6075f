"""The command safety rule on a running daemon (the rule matrix and `arbiter check` are in
tests/config/test_command_safety.py): a rule file others could change never gets its command
run; the same rule in a safe file does."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from arbiter.config.safety import command_file_problem
from arbiter_testing.node import PYTHON, HarnessNode


def rule(marker: Path) -> str:
    script = f"open({str(marker)!r}, 'a').write('ran\\n'); print(1)"
    return (
        f"id: counted\nmatch: {{cmdline: ['sleep 1017']}}\n"
        f"protect:\n  metric: progress_rate\n  source: {{kind: exec, command: [{PYTHON!r}, '-c', {script!r}], every_s: 0.2}}\n"
    )


def test_a_running_daemon_runs_no_command_from_a_file_others_can_change(tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix=".arbiter-live-safety-", dir=Path.home()))
    try:
        folder.chmod(0o755)
        above = command_file_problem(str(folder / "x"))
        if above and str(folder) not in above and "cannot check" not in above:
            pytest.skip(f"a folder above this account's home is not safe: {above}")
        marker = tmp_path / "ran"
        path = folder / "counted.yaml"
        path.write_text(rule(marker))
        path.chmod(0o664)  # group-writable: anyone in the group could make the daemon run anything
        node = HarnessNode(tmp_path, tenants_dirs=[str(folder)])
        try:
            node.start()
            node.spawn(["sleep", "1017"])
            rejected = node.events(code="CONFIG_REJECTED", contains="runs a command")
            assert any("writable by" in e["message"] for e in rejected), rejected
            assert "counted" not in {r["id"] for r in node.status()["rules"]}
            assert not marker.exists(), "the command of a refused file ran"

            # the same rule, written safely (a new file, mode 0644): now it loads and runs
            tmp = folder / ".counted.tmp"
            tmp.write_text(rule(marker))
            tmp.chmod(0o644)
            os.replace(tmp, path)
            node.wait_for(lambda: "counted" in {r["id"] for r in node.status()["rules"]}, timeout=20)
            node.wait_for(marker.exists, timeout=20)
        finally:
            node.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
