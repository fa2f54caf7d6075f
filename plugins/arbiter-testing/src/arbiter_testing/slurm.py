"""A real Slurm cluster on loopback, for tests and bench scripts: munged, slurmctld and one
slurmd per node (``MULTIPLE_SLURMD``), each node with its own arbiter daemon.

Everything lives in one folder (key, sockets, spool, state, logs) on free ports; ``close()``
stops every daemon by its pid, whatever happened, and then any process still running under
this cluster's slurm.conf (slurmstepd, a job's tasks).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from arbiter_testing.node import HarnessNode
from arbiter_testing.waiting import wait_until

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
#: a wait on the cluster goes this long before it fails: a deadline, not a delay
WAIT_S = 60.0
HOOK = shutil.which("arbiter-slurm") or str(Path(sys.executable).parent / "arbiter-slurm")


def unavailable() -> str:
    """Why a cluster cannot run here ("" when it can)."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as their users"
    return ""


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now on 127.0.0.1 (held together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, root: Path, nodes: list[str]) -> None:
        self.root = root
        self.nodes = nodes
        self.dir = root / "slurm"
        self.dir.mkdir(mode=0o755)
        os.chmod(root, 0o755)  # jobs run as other users reach the munge socket and their scripts
        for parent in root.parents:
            if parent == Path("/tmp") or parent == Path("/"):
                break
            os.chmod(parent, os.stat(parent).st_mode | 0o005)
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge.sock"
        self.pids: dict[str, subprocess.Popen[bytes]] = {}
        self.arbiter: dict[str, HarnessNode] = {}
        self.configs = self.dir / "arbiter"  # one arbiter config per node, named after it, beside slurm.conf
        self.configs.mkdir()
        os.chmod(self.configs, 0o755)  # a TaskProlog runs as the job's user and looks its node's config up there

    # --- the environment every Slurm command and hook sees -----------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def write_conf(self) -> None:
        ctld, node_port, *ports = free_ports(2 + len(self.nodes))
        d = self.dir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir(exist_ok=True)
        lines = [
            "ClusterName=arbitertest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            f"SlurmdPort={node_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=5",
            f"Prolog={HOOK}",
            f"TaskProlog={HOOK}",
            f"Epilog={HOOK}",
        ]
        for name, port in zip(self.nodes, ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=4 "
                "Feature=arbiter State=UNKNOWN"
            )
        # least loaded node first: a job not pinned to a node goes where fewest CPUs are taken,
        # so a batch spreads over the fleet as GPU work is spread, rather than filling n1 first
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP LLN=YES")
        self.conf.write_text("\n".join(lines) + "\n")

    # --- starting and stopping ----------------------------------------------------------------

    def _spawn(self, key: str, args: list[str]) -> None:
        with open(self.dir / "log" / f"{key}.out", "ab") as out:
            self.pids[key] = subprocess.Popen(args, stdout=out, stderr=out, env=self.env(), start_new_session=True)

    def start_munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        d = self.dir
        self._spawn(
            "munged",
            [
                _program("munged"),
                "-F",
                "-f",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--seed-file={d / 'munged.seed'}",
                f"--log-file={d / 'log' / 'munged.log'}",
            ],
        )
        wait_until(self.munge_socket.exists, 20, "munged's socket")

    def start_controller(self) -> None:
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i"])

    def start_node(self, name: str) -> None:
        self._spawn(f"slurmd-{name}", [_program("slurmd"), "-D", "-N", name])

    def start(self) -> None:
        self.write_conf()
        self.start_munge()
        self.start_controller()
        for name in self.nodes:
            self.start_node(name)
        wait_until(
            lambda: all(s.startswith("idle") for s in self.node_states().values()) and self.node_states(),
            WAIT_S,
            "every slurmd idle in sinfo",
            poll_s=0.1,
            ignore=(subprocess.CalledProcessError, subprocess.TimeoutExpired),
        )

    def start_arbiter(self, name: str, slurm: dict[str, Any] | None = None, **config: Any) -> HarnessNode:
        """An arbiter daemon for node ``name``: its node config has ``config`` and the section
        ``slurm: {node: name, **slurm}``."""
        node = HarnessNode(self.root / f"arbiter-{name}", slurm={"node": name, **(slurm or {})}, **config)
        shutil.copy(node.config_path, self.configs / f"{name}.yaml")
        node.config_path = self.configs / f"{name}.yaml"
        self.arbiter[name] = node
        self._start(node)
        return node

    def restart_arbiter(self, name: str) -> None:
        """Start node ``name``'s daemon again (stopped or killed first)."""
        self._start(self.arbiter[name])

    def _start(self, node: HarnessNode) -> None:
        node.start(30.0, SLURM_CONF=str(self.conf))

    def restart_controller(self) -> None:
        self.stop_process("slurmctld")
        self.start_controller()

    def features(self) -> dict[str, set[str]]:
        """Each node's active features, as sinfo shows them."""
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %b")
        return {
            n: set(f.split(",")) - {"(null)"} for n, f in (line.split() for line in out.splitlines() if line.strip())
        }

    def reasons(self) -> dict[str, str]:
        """Each drained or down node's reason, as ``sinfo -R`` shows it."""
        out = self.run("sinfo", "-R", "--noheader", "--format=%N|%E")
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def stop_process(self, key: str, timeout: float = 10.0) -> None:
        proc = self.pids.pop(key, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop everything this cluster started, each by its pid, whatever state it is in."""
        try:
            subprocess.run(
                ["scancel", "--full", "--user", "root"], env=self.env(), capture_output=True, timeout=10, check=False
            )
            for user in ("nobody",):
                subprocess.run(
                    ["scancel", "--user", user], env=self.env(), capture_output=True, timeout=10, check=False
                )
        except (subprocess.TimeoutExpired, OSError):
            pass
        for node in self.arbiter.values():
            node.close()
        for key in [k for k in self.pids if k.startswith("slurmd-")]:
            self.stop_process(key)
        self.stop_process("slurmctld")
        self.stop_process("munged")
        self.kill_leftovers()

    def leftovers(self) -> list[int]:
        """Processes still running under this cluster's slurm.conf (slurmstepd, tasks)."""
        found = []
        marker = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
            except (OSError, IndexError):
                continue
        return found

    def kill_leftovers(self) -> None:
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(lambda: not self.leftovers() or None, 10, "the cluster's processes gone", poll_s=0.05)

    # --- asking Slurm ---------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            list(args), env=self.env(**(env or {})), capture_output=True, text=True, timeout=30, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%N %t"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def sbatch(self, script: str, *options: str, env: dict[str, str] | None = None) -> int:
        path = self.root / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        out = self.run("sbatch", "--parsable", f"--output={self.root}/out-%j.txt", *options, str(path), env=env)
        return int(out.strip().split(";")[0])

    def jobs(self) -> dict[int, dict[str, Any]]:
        data = json.loads(self.run("squeue", "--json"))
        return {j["job_id"]: j for j in data["jobs"]}

    def output(self, job_id: int) -> str:
        try:
            return (self.root / f"out-{job_id}.txt").read_text()
        except FileNotFoundError:
            return ""

    def logs(self) -> str:
        parts = []
        for log in sorted((self.dir / "log").iterdir()):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)
