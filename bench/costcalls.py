"""The two hot paths' work as counts of Python function calls, which the box's noise cannot move.

- ``tick``: one tick over a fixed process table (three hundred processes, ten rules: the
  shipped rule files and a protected program with a JSONL phase source), and the decision
  on it: ``Ticker.once`` and ``Decider.take`` of what it sent, with every plugin call they
  hand to the plugin pool.  The table comes from a plugin of this file's, so nothing is read
  from ``/proc`` for it; its scan is counted apart (``scan``), over the same table written
  as a ``/proc`` of its own, the second of two scans (what the scan does on a tick where
  nothing changed).
- ``phase``: one phase line appended to the watched file, until the reflex process's
  translator has paused the job armed for it and the line saying so is written: the JSONL
  source's thread and the reflex host, in this process.

Used by ``bench/cost.py --calls`` and its test; each figure is the least of a few runs (a
watcher's rare safety look can land inside one).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from arbiter.plugin import ProcessInfo, hookimpl

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 300
RUNS = 3
PROTECTED = "cost-calls-protected"


class Counter:
    """Python calls made while on, on this thread and on threads whose name starts with one
    of ``prefixes`` (every thread when it is empty); each thread counts apart, so none
    loses another's count."""

    def __init__(self, prefixes: tuple[str, ...] = ()) -> None:
        self.on = False
        self.counts: dict[int, int] = {}
        self.prefixes = prefixes
        self.main = threading.get_ident()

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            me = threading.get_ident()
            if me == self.main or not self.prefixes or threading.current_thread().name.startswith(self.prefixes):
                self.counts[me] = self.counts.get(me, 0) + 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.counts.clear()
        self.on = True
        try:
            yield
        finally:
            self.on = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@contextmanager
def profiled(counter: Counter) -> Iterator[None]:
    threading.setprofile(counter.hook)
    sys.setprofile(counter.hook)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def fixed_table(protected: int) -> list[ProcessInfo]:
    """Three hundred processes as a desktop has them: a session's shells and sleepers, a
    protected program (``protected`` its pid), kernel threads."""
    out = [ProcessInfo(1, 0, "systemd", "/usr/lib/systemd/systemd", ("/sbin/init",), 0, "root", 1000.0, "S", 10**9)]
    for pid in range(2, 60):
        out.append(ProcessInfo(pid, 2 if pid > 2 else 0, f"kworker/{pid}", "", (), 0, "root", 1000.0, "I", 0))
    for pid in range(100, 100 + PROCESSES - 60):
        argv = ("sh", "-c", "sleep 600; :", f"group-{pid % 10}") if pid % 2 else ("sleep", str(pid))
        out.append(
            ProcessInfo(
                pid,
                pid - 1 if pid % 2 == 0 else 1,
                argv[0],
                f"/usr/bin/{argv[0]}",
                argv,
                1000,
                "user",
                2000.0 + pid,
                "S",
                pid * 10**6,
            )
        )
    out.append(
        ProcessInfo(
            protected,
            1,
            "sh",
            "/usr/bin/sh",
            ("sh", "-c", "exec sleep 1", PROTECTED),
            1000,
            "user",
            3000.0,
            "S",
            5 * 10**6,
        )
    )
    return out


class FixedTable:
    def __init__(self, table: list[ProcessInfo]) -> None:
        self.table = table

    @hookimpl(tryfirst=True)
    def arbiter_process_table(self, scratch: dict[str, Any]) -> list[ProcessInfo]:
        return list(self.table)


def node_config(root: Path, phases: Path, **more: Any) -> Path:
    tenants = root / "tenants.d"
    tenants.mkdir(parents=True)
    for shipped in sorted((ROOT / "tenants.d").glob("*.yaml")):
        shutil.copy(shipped, tenants / shipped.name)
        os.chmod(tenants / shipped.name, 0o644)  # rules that send requests are taken only from safe files
    during: dict[str, Any] = {
        "source": {"kind": "jsonl", "path": str(phases), "event": "status", "field": "phase", "on": ["on"]},
        "pause_fleet": {"scope": "all"},
    }
    rule: dict[str, Any] = {
        "id": "protected",
        "priority": 90,
        "immediate": True,
        "match": {"cmdline": [PROTECTED]},
        "during": [during],
    }
    (tenants / "protected.yaml").write_text(yaml.safe_dump(rule, sort_keys=False))
    # a folder of rules written long before the daemon starts, as on a node: the figure then
    # counts the tick a node runs, not how many ticks fall within the folder's first seconds
    written = time.time_ns() - 3600 * 1_000_000_000
    os.utime(tenants, ns=(written, written))
    config = {
        "state_dir": str(root / "state"),
        "tenants_dirs": [str(tenants)],
        "readers": ["cpu_time"],
        "stand_in_gpu": True,
        "http": {"enabled": False},
        **more,
    }
    path = root / "arbiter.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def tick_calls() -> int:
    """One tick and its decision over the fixed table (the least of :data:`RUNS`)."""
    from arbiter.config.loader import load_node_config
    from arbiter.daemon.core import Daemon
    from arbiter.daemon.inbox import drained
    from arbiter.pluginmanager import build_plugin_manager

    root = Path(tempfile.mkdtemp(prefix="arbiter-calls-"))
    phases = root / "phases.jsonl"
    phases.write_text(json.dumps({"event": "status", "phase": "off"}) + "\n")
    counter = Counter(("plugin",))
    daemon = None
    try:
        with profiled(counter):
            config, _ = load_node_config(node_config(root, phases, reflex_process=False))
            host = build_plugin_manager(
                config.plugins, config.disable_plugins, extra=[("fixed", FixedTable(fixed_table(4242)))]
            )
            daemon = Daemon(config, root / "arbiter.yaml", host=host)

            def one() -> None:
                daemon.ticker._certs_read_at = time.monotonic()  # not due: read one tick in a few
                daemon.ticker.once()
                batch = drained(daemon.decider.inbox)
                daemon.decider.take(batch or [])

            for _ in range(2):  # the rule book loaded, the sources started, the first decision made
                one()
            runs = []
            for _ in range(RUNS):
                with counter.counting():
                    one()
                runs.append(counter.total)
        return min(runs)
    finally:
        if daemon is not None:
            daemon.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def scan_calls() -> int:
    """A scan of the fixed table, written as a ``/proc`` of its own, where nothing changed."""
    from arbiter_matchers import _procscan

    root = Path(tempfile.mkdtemp(prefix="arbiter-calls-proc-"))
    real = _procscan._PROC
    try:
        fake_proc(root, fixed_table(4242))
        _procscan._PROC = str(root)
        runs = []
        for _ in range(RUNS):
            scan = _procscan.ProcScan(keep=1000)
            counter = Counter()
            with profiled(counter):
                scan.scan()
                with counter.counting():
                    scan.scan()
            scan.close()
            runs.append(counter.total)
        return min(runs)
    finally:
        _procscan._PROC = real
        shutil.rmtree(root, ignore_errors=True)


def fake_proc(root: Path, table: list[ProcessInfo]) -> None:
    """``table`` as ``/proc`` files the scan reads: ``stat`` (the boot time), and per pid
    ``stat``, ``cmdline``, ``status``."""
    (root / "stat").write_text("cpu 0 0 0 0\nbtime 1000\n")
    for p in table:
        d = root / str(p.pid)
        d.mkdir()
        ticks = int((p.cpu_ns or 0) // 10**7)
        fields = (
            [p.state, str(p.ppid)]
            + ["0"] * 9
            + [str(ticks), "0"]
            + ["0"] * 6
            + [str(int((p.start_time - 1000) * 100)), "1234", "0"]
        )
        (d / "stat").write_text(f"{p.pid} ({p.name[:15]}) {' '.join(fields)} 0 0 0\n")
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in p.cmdline))
        (d / "status").write_text(f"Name:\t{p.name}\nUid:\t{p.uid}\t{p.uid}\t{p.uid}\t{p.uid}\n")


class Lines(io.StringIO):
    """The reflex host's lines to the daemon; ``seen`` is set when a line holding ``wanted`` is written."""

    def __init__(self) -> None:
        super().__init__()
        self.wanted = ""
        self.seen = threading.Event()

    def write(self, text: str) -> int:
        if self.wanted and self.wanted in text:
            self.seen.set()
        return super().write(text)


def phase_calls() -> int:
    """One phase line → the reflex host's translator paused the armed job (the least of :data:`RUNS`)."""
    from arbiter.plugin import JobTarget, ProcessRef
    from arbiter.pluginmanager import build_plugin_manager
    from arbiter.reflex.process import ReflexHost
    from arbiter.reflex.wire import Arm, Moves, Setup, SourceSpec, arm_key

    root = Path(tempfile.mkdtemp(prefix="arbiter-calls-phase-"))
    phases = root / "phases.jsonl"
    phases.touch()
    job = subprocess.Popen(["sleep", "600"])
    counter = Counter()
    host: ReflexHost | None = None
    try:
        import psutil

        start = psutil.Process(job.pid).create_time()
        plugins = build_plugin_manager([], [])
        only = sorted({plugins.kind("sources", "jsonl").plugin, plugins.kind("translators", "signal").plugin})  # type: ignore[union-attr]
        setup = Setup(
            plugins=[],
            disable=[],
            only=only,
            timeout_s=5.0,
            state_dir=str(root),
            stand_in_gpu=True,
            sections={},
            translator="signal",
            journal=str(root / "paused.journal"),
            lock=str(root / "reflex.lock"),
        )
        out = Lines()
        source = {"path": str(phases), "event": "status", "field": "phase", "on": ["on"]}
        with profiled(counter):
            host = ReflexHost(setup, out)
            slot = ("protected", 0, 1)
            pause = Moves((JobTarget("j1", "job", (ProcessRef(job.pid, start),)),))
            host.take(Arm(1, {arm_key(*slot): {"on": pause, "off": Moves()}}))
            host.sync((SourceSpec(*slot, "jsonl", source),))
            runs = []
            for phase in ["off", "on", "off", "on", "off", "on"]:
                out.seen.clear()
                out.wanted = '"did"' if phase == "on" else '"off"'
                with counter.counting() if phase == "on" else _nothing():
                    with open(phases, "a") as fh:
                        fh.write(json.dumps({"event": "status", "phase": phase}) + "\n")
                    if not out.seen.wait(10):
                        raise RuntimeError(f"the reflex host did not act on {phase!r}:\n{out.getvalue()[-2000:]}")
                if phase == "on":
                    runs.append(counter.total)
                    os.kill(job.pid, 18)  # SIGCONT: the next "on" pauses it again
        return min(runs)
    finally:
        if host is not None:  # its watcher threads and lock end here: the caller's process goes on
            host.sync(())
            os.close(host.lock_fd)
        job.kill()
        job.wait()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def figures() -> dict[str, int]:
    paths: dict[str, Callable[[], int]] = {"tick": tick_calls, "scan": scan_calls, "phase": phase_calls}
    return {name: path() for name, path in paths.items()}


if __name__ == "__main__":
    print(json.dumps(figures(), indent=2))
