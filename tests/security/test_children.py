"""Root runs none of another account's code: a daemon started in a folder ``nobody`` filled
with a package named ``arbiter`` imports none of it in any child it starts (the probes that
any account's ``gpu-apis refresh`` starts, the reflex process), and every place arbiter
starts a process for itself goes through the one helper that starts children so."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from arbiter.api.transport import request
from arbiter_testing import run_as, wait_until
from arbiter_testing.node import HarnessNode
from arbiter_testing.rules import phase_rule

from .conftest import needs_root

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

#: files that start processes other than the daemon's own children, and why that is right
NOT_THE_DAEMONS = {
    "arbiter/runtime/children.py": "the helper itself",
    "arbiter/cli/jobrun.py": "`arbiter job run` starts the person's own command, as that person",
    "arbiter/sdk/supervisor.py": "runs inside a job, starting the job's own command",
    "arbiter/cli/conform.py": "`arbiter conform` runs the person's program under test, as that person",
    "arbiter/demo/node.py": "`arbiter demo` and the tests start a daemon and jobs, as the person",
}
STARTS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "pty": {"spawn", "fork"},
}


def product_files() -> list[Path]:
    files = sorted((REPO / "arbiter").rglob("*.py"))
    for dist in sorted((REPO / "plugins").iterdir()):
        if dist.name != "arbiter-testing":  # the test-only distribution starts test programs
            files += sorted((dist / "src").rglob("*.py"))
    return files


def test_every_process_arbiter_starts_for_itself_starts_through_arbiter_children() -> None:
    escaped = []
    for path in product_files():
        rel = str(path.relative_to(REPO))
        if rel in NOT_THE_DAEMONS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and node.func.attr in STARTS.get(owner.id, ()):
                    escaped.append(f"{rel}:{node.lineno}: {owner.id}.{node.func.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in STARTS:
                names = {a.name for a in node.names} & STARTS[node.module]
                if names:
                    escaped.append(f"{rel}:{node.lineno}: from {node.module} import {', '.join(sorted(names))}")
    assert not escaped, "start these through arbiter.runtime.children (start_child/run_child):\n" + "\n".join(escaped)


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


PLANTED = """
import os
open(os.environ.get("MARK", "/dev/null") if False else {mark!r}, "a").write(str(os.getuid()) + "\\n")
raise ImportError("planted")
"""


def plant_package(folder: Path, mark: Path) -> None:
    """As the attacker: ``arbiter/__init__.py`` (and ``arbiter_probes``) that leave a mark."""
    for name in ("arbiter", "arbiter_probes", "arbiter_readers"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(PLANTED.format(mark=str(mark)))


@needs_root
def test_a_daemon_started_in_an_attackers_folder_runs_none_of_its_code(shared_root: Path) -> None:
    theirs = shared_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    mark = shared_root / "ran-as"
    mark.touch(mode=0o666)
    os.chmod(mark, 0o666)
    run_as("nobody", lambda: plant_package(theirs, mark))
    node = HarnessNode(shared_root / "node")
    # as a person starts it: the installed command, in the folder the shell is in
    command = [str(Path(sys.executable).with_name("arbiter")), "run", "--config", str(node.config_path)]
    with open(node.root / "daemon.log", "ab") as log:
        node.daemon = subprocess.Popen(command, cwd=theirs, stdout=log, stderr=log, env=node.env())
    try:
        wait_until(lambda: node.socket.exists() and (node.state_dir / "daemon.json").exists(), 60, "the daemon")
        assert os.readlink(f"/proc/{node.daemon.pid}/cwd") == "/"
        # any account may ask for the probes again: each runs in a process of its own, as root
        answer = run_as("nobody", lambda: request(str(node.socket), "gpu-apis", refresh=True, timeout=120))
        assert answer["gpu_apis"]["evidence"], answer
        children = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and parent_of(int(pid)) == node.daemon.pid]
        for pid in children:  # the reflex process, a probe still running: each in /
            try:
                assert os.readlink(f"/proc/{pid}/cwd") == "/", Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                pass  # it ended meanwhile
        assert mark.read_text() == "", f"root imported the planted package (uids: {mark.read_text().split()})"
    finally:
        node.close()


def _umask(pid: int) -> str:
    with open(f"/proc/{pid}/status") as fh:
        return next(line.split()[1] for line in fh if line.startswith("Umask:"))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        out.extend(kids := children.get(todo.pop(), []))
        todo.extend(kids)
    return out


def test_a_daemon_started_with_umask_0000_makes_nothing_others_may_write(tmp_path: Path) -> None:
    """Started with the mask 0000 (as in the attack), the daemon, its reflex process and its
    child workers all run with 0022, and what the daemon makes is no one else's to write."""
    if not os.path.exists("/proc/self/status"):
        return  # the mask of another process is read from /proc
    node = HarnessNode(tmp_path / "node")
    node.add_rule("p", phase_rule("p", "sleep 1039", str(tmp_path / "phase.jsonl"), on=["x"]))
    before = os.umask(0)
    try:
        node.start()
    finally:
        os.umask(before)
    try:
        assert node.daemon is not None
        daemon = node.daemon.pid
        wait_until(lambda: len(_descendants(daemon)) >= 2 or None, 30, "the reflex process and a worker")
        masks = {pid: _umask(pid) for pid in [daemon, *_descendants(daemon)]}
        assert set(masks.values()) == {"0022"}, masks
        for path in (node.state_dir / "jobs", node.state_dir / "daemon.json"):
            if path.exists():
                assert not path.stat().st_mode & 0o022, path
    finally:
        node.close()
