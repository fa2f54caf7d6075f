"""Which GPU APIs this host provides: every probe plugin, each in its own process.

A probe loads a vendor's library or runs its tool; a broken driver can hang or crash the
process that asks.  So each runs as ``python -m arbiter.probing KIND`` under a timeout, and
a probe that times out, crashes or prints garbage counts as "not usable" with that said.
Probing is discovery, never urgent: the children run at a lower priority and no more at a
time than there are CPUs, so a probe run (a second of start-up each) does not take CPU from a
protected program.  The answer has this shape:
``{"host": [...], "containers": [...], "evidence": {api: text}, "platform": ..., "arbiter_version": ...}``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from arbiter import __version__
from arbiter.config.jobdocs import Manifest
from arbiter.runtime.children import python_module, start_child

PROBE_TIMEOUT_S = 20.0
#: how much nicer than the daemon a probe's process runs
PROBE_NICE = 10
#: the probe kind whose ``apis()`` says what a container gets (from the host's CDI specs)
CONTAINERS = "containers"


def platform_tag() -> str:
    system = {"darwin": "darwin", "win32": "windows"}.get(sys.platform, "linux")
    return f"{system}-{platform.machine().lower() or 'unknown'}"


class Children:
    """The probe processes running now: a daemon that stops ends them rather than leave them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[str]] = set()
        self.closed = False

    def add(self, proc: subprocess.Popen[str]) -> bool:
        """Keep ``proc``; False once closed (the caller ends it)."""
        with self._lock:
            if not self.closed:
                self._running.add(proc)
            return not self.closed

    def discard(self, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            self._running.discard(proc)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            running, self._running = self._running, set()
        for proc in running:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """The probe and whatever it started (its tools run in its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_probe(
    kind: str,
    plugins: Sequence[str] = (),
    timeout_s: float = PROBE_TIMEOUT_S,
    disable: Sequence[str] = (),
    children: Children | None = None,
) -> dict[str, Any]:
    """One probe in a child process: ``{"usable", "evidence", "apis"?, "seconds"}``."""
    started = time.monotonic()
    env = {"ARBITER_PROBE_PLUGINS": json.dumps(list(plugins)), "ARBITER_PROBE_DISABLE": json.dumps(list(disable))}
    # its own process group (no terminal's signals) but the asker's session: where the
    # scheduler groups by session, a new one would be a new group and undo the lower priority
    proc = start_child(
        python_module("arbiter.probing", kind),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        extra_env=env,
        process_group=0,
    )
    if children is not None and not children.add(proc):
        _kill_group(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        # a descendant that left the group may hold the pipes open: wait for the probe alone
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return {
            "usable": False,
            "evidence": f"the {kind} probe did not answer within {timeout_s:g}s (a hung driver?)",
            "seconds": round(time.monotonic() - started, 2),
        }
    finally:
        if children is not None:
            children.discard(proc)
    seconds = round(time.monotonic() - started, 2)
    try:
        answer = json.loads(stdout.strip().splitlines()[-1])
        if not isinstance(answer, dict) or not isinstance(answer.get("usable"), bool):
            raise ValueError("not a probe answer")
    except (ValueError, IndexError):
        # a failed probe is reported with its last line of stderr
        tail = (stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {"usable": False, "evidence": f"the {kind} probe failed: {tail[:300]}", "seconds": seconds}
    answer["seconds"] = seconds
    return answer


def gpu_apis(
    kinds: Sequence[str],
    plugins: Sequence[str] = (),
    timeout_s: float = PROBE_TIMEOUT_S,
    disable: Sequence[str] = (),
    children: Children | None = None,
) -> dict[str, Any]:
    """Run every probe (in parallel, each in its own process) and say what the host provides."""
    kinds = sorted(set(kinds))
    with ThreadPoolExecutor(max_workers=max(1, min(len(kinds), os.cpu_count() or 1))) as pool:
        answers = dict(
            zip(kinds, pool.map(lambda k: run_probe(k, plugins, timeout_s, disable, children), kinds), strict=True)
        )
    host = sorted(k for k, a in answers.items() if a["usable"] and k != CONTAINERS)
    containers = (
        sorted(answers.get(CONTAINERS, {}).get("apis") or []) if answers.get(CONTAINERS, {}).get("usable") else []
    )
    return {
        "host": host,
        "containers": containers,
        "evidence": {k: a["evidence"] for k, a in answers.items()},
        "platform": platform_tag(),
        "arbiter_version": __version__,
        "probed_at": time.time(),
    }


class Prober:
    """Runs the probes off the fast path: on first need, again on request; one run at a time,
    and a caller asking during a run waits for that run rather than starting another."""

    def __init__(
        self, kinds: Callable[[], Sequence[str]], plugins: Sequence[str] = (), disable: Sequence[str] = ()
    ) -> None:
        self._kinds = kinds
        self._plugins = list(plugins)
        self._disable = list(disable)
        self._cond = threading.Condition()
        self._running = False
        self._finished = 0
        self._finished_at = -math.inf
        self.answer: dict[str, Any] | None = None
        self._children = Children()

    def close(self) -> None:
        """End the probes running now; none start after."""
        self._children.close()

    def _run(self) -> None:
        try:
            result = gpu_apis(self._kinds(), self._plugins, disable=self._disable, children=self._children)
        except Exception as exc:  # a failing runner must not leave callers waiting
            result = {
                "host": [],
                "containers": [],
                "evidence": {"probes": f"could not run: {exc}"},
                "platform": platform_tag(),
                "arbiter_version": __version__,
            }
        result["probed_at"] = time.time()
        with self._cond:
            self.answer, self._running = result, False
            self._finished += 1
            self._finished_at = time.monotonic()
            self._cond.notify_all()

    def _start(self) -> None:  # under the lock
        if not self._running and not self._children.closed:
            self._running = True
            threading.Thread(target=self._run, name="probes", daemon=True).start()

    def refresh(self, wait_s: float = 0.0, min_age_s: float = 0.0) -> dict[str, Any] | None:
        """Probe again (or join the run in progress); wait up to ``wait_s`` for it.  An
        answer younger than ``min_age_s`` is given as it is, without a new run."""
        with self._cond:
            if self.answer is not None and time.monotonic() - self._finished_at < min_age_s and not self._running:
                return self.answer
            target = self._finished + 1
            self._start()
            self._cond.wait_for(lambda: self._finished >= target, wait_s)
            return self.answer

    def get(self, wait_s: float = 0.0) -> dict[str, Any] | None:
        """The last answer; the first call starts a run and waits up to ``wait_s`` for it."""
        with self._cond:
            if self.answer is None:
                self._start()
                self._cond.wait_for(lambda: self.answer is not None, wait_s)
            return self.answer


def missing_apis(apis_any: Sequence[str], in_container: bool, provided: dict[str, Any]) -> str | None:
    """Why a job needing one of ``apis_any`` cannot be placed here, or None when it can."""
    if not apis_any:
        return None
    where = "containers" if in_container else "host"
    have = set(provided.get(where) or [])
    if have & set(apis_any):
        return None
    evidence = provided.get("evidence", {})
    said = "; ".join(f"{api}: {evidence.get(api, 'no probe plugin checks it')}" for api in apis_any)
    place = "a container on this host" if in_container else "this host"
    return f"it needs one of {', '.join(apis_any)} and {place} provides {', '.join(sorted(have)) or 'none'} ({said})"


def placement(manifest: Manifest, platform_name: str, provided: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(why ``manifest``'s job cannot run on ``platform_name`` given the probes' answer or
    None, warnings).  A variant for the platform replaces ``gpu`` whole; an API no installed
    probe checks is accepted with a warning (and then is never provided)."""
    gpu = manifest.gpu_for(platform_name)
    known = set(provided.get("evidence") or {})  # the APIs the installed probes check
    warnings = [
        f"unknown GPU API {api!r}: accepted, but no installed probe checks it, so no host provides it"
        for api in gpu.apis_any
        if api not in known
    ]
    return missing_apis(gpu.apis_any, gpu.in_container, provided), warnings


def _lower_priority() -> None:
    if hasattr(os, "nice"):
        try:
            os.nice(PROBE_NICE)
        except OSError:
            pass  # not allowed here: the probe still runs


def _child(kind: str) -> int:
    """In the child: load the plugins, run one probe, print one JSON line."""
    _lower_priority()  # before the imports: they are most of a probe's CPU time
    from arbiter.plugin import PluginContext
    from arbiter.pluginmanager import build_plugin_manager

    plugins = json.loads(os.environ.get("ARBITER_PROBE_PLUGINS", "[]"))
    host = build_plugin_manager(plugins, json.loads(os.environ.get("ARBITER_PROBE_DISABLE", "[]")))
    info = host.kind("probes", kind)
    if info is None:
        print(json.dumps({"usable": False, "evidence": f"no installed plugin registers the {kind} probe"}))
        return 0
    probe = info.cls(info.cls.Options(), PluginContext(state_dir=Path.cwd()))
    usable, evidence = probe.probe()
    answer: dict[str, Any] = {"usable": bool(usable), "evidence": str(evidence)}
    if hasattr(probe, "apis"):
        answer["apis"] = list(probe.apis())
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1]))
