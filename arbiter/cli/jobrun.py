"""``arbiter job run``: register, wait to be admitted, then run the command under control."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from arbiter.api.ops import Op
from arbiter.api.transport import DaemonUnavailable, RequestRefused
from arbiter.api.verdict import marked_state, verdict_mark
from arbiter.cli.client import Client, CliError
from arbiter.cli.signal_relay import relay_signals
from arbiter.sdk.control import CONTROL_ENV, EVENTS_ENV, ignore_nudges

COOPERATIVE = ("cooperative_throttle", "cooperative_pause")


def build_manifest(cmd: list[str], name: str | None, manifest_path: str | None, cooperative: bool) -> dict[str, Any]:
    if manifest_path:
        from arbiter.config.errors import ConfigError
        from arbiter.config.loader import parse_manifest, read_text

        try:
            text = read_text(Path(manifest_path))
            # --name stands in for the manifest's own name:, which it replaces anyway
            manifest = parse_manifest(text, manifest_path, name).model_dump(mode="json")
        except ConfigError as exc:
            raise CliError(f"the job manifest is not valid:\n{exc}", 2) from None
        if name:
            manifest["name"] = name
    else:
        base = Path(cmd[0]).name or "job"
        manifest = {
            "name": name or "".join(c if c.isalnum() or c in "._-" else "-" for c in base),
            "gpu": {"use": "shared"},
        }
    if cooperative:
        manifest["capabilities"] = sorted(set(manifest.get("capabilities", [])) | set(COOPERATIVE))
    return manifest


def _say(message: str) -> None:
    print(f"arbiter: {message}", file=sys.stderr, flush=True)


#: the job could not be placed on this host (distinct from the command's own failure)
EXIT_UNPLACEABLE = 69  # EX_UNAVAILABLE


def change(before: str | None, answer: dict[str, Any], job_id: str) -> tuple[str | None, str]:
    """What to print of a job's verdict: a line when its mark (:func:`verdict_mark`: its
    state, duty or the codes holding it) changes, else none, and the mark to compare the
    next verdict with."""
    now = verdict_mark(answer)
    if now == before:
        return None, now
    why = "; ".join(f"{r['code']}: {r['message']}" for r in answer["reasons"])
    state = answer["state"]
    duty = round(float(answer.get("duty") or 0.0), 2)
    if state == "held":
        line = f"waiting: {why or 'deciding'} (arbiter explain {job_id})"
    elif state == "paused":
        line = f"job {job_id} paused: {why or 'by its owner'} (arbiter explain {job_id})"
    elif state == "run":
        was = marked_state(before)
        line = f"job {job_id} {'resumed' if was == 'paused' else 'runs'}" + (f" at duty {duty:.2f}" if duty < 1 else "")
        line += f" ({why})" if why else ""
    else:
        line = f"job {job_id} {state}" + (f": {why}" if why else "")
    return line, now


#: how long the watcher waits before asking again after the daemon could not answer, or
#: answered with nothing new
WATCH_S = 1.0
#: the watcher's connection waits this long for an answer: the daemon answers a watcher
#: within its longest wait (``WATCH_MOST_S``, 30 s)
WATCH_CALL_S = 40.0


def _watch(client: Client, job_id: str, ended: threading.Event, shown: str) -> None:
    """While the command runs: one line for each change of what arbiter does to it.  The
    daemon answers when the verdict's mark is no longer the one shown (or after half a
    minute), so a job nothing happens to costs a request every half minute, not one a
    second."""
    while not ended.is_set():
        try:
            answer = client.call(Op.JOB_WAIT, timeout=WATCH_CALL_S, id=job_id, unless=shown)
        except (CliError, RequestRefused, DaemonUnavailable):
            if ended.wait(WATCH_S):  # a daemon restarting: the next look tells
                return
            continue
        if answer["state"] == "ended" or ended.is_set():
            return
        line, shown = change(shown, answer, job_id)
        if line:
            _say(line)
        elif ended.wait(WATCH_S):  # answered unchanged at once: the daemon holds no more of the account's watchers
            return


def _call_retrying(client: Client, op: Op, **args: Any) -> dict[str, Any]:
    """Calls that must reach the daemon eventually: wait out a daemon restart.  A refusal
    is final and becomes a CliError."""
    warned = False
    while True:
        try:
            return client.call(op, **args)
        except RequestRefused as exc:
            raise CliError(f"the daemon refused {op}: {exc}") from None
        except CliError as exc:
            if not warned:
                _say(f"{exc}; retrying")
                warned = True
            time.sleep(1.0)


def _enclosing_job(client: Client) -> str | None:
    """The job this command already runs in, where a scheduler's hook handed it over and told
    it so (``ARBITER_JOB_ID`` of a job this user may act on): then it is the same job."""
    job_id = os.environ.get("ARBITER_JOB_ID")
    if not job_id or not os.environ.get(CONTROL_ENV):
        return None
    try:
        answer = client.call(Op.JOB_WAIT, id=job_id)  # answers at once for an admitted job, else within 1 s
    except (CliError, RequestRefused) as exc:
        # a job that ended, or another daemon's: this command becomes a job of its own
        _say(f"not running as part of job {job_id} ({exc}): registering a job of its own")
        return None
    return job_id if answer.get("state") != "ended" else None


def _run_inside(client: Client, job_id: str, cmd: list[str]) -> int:
    """Run ``cmd`` as part of the enclosing job: admitted when it is, paused and stopped with it."""
    _say(f"running inside job {job_id} (arbiter explain {job_id})")
    shown = None
    while True:
        answer = _call_retrying(client, Op.JOB_WAIT, id=job_id, timeout=2.0)
        if answer["admitted"] or answer["state"] == "ended":
            break
        summary = "; ".join(f"{r['code']}: {r['message']}" for r in answer["reasons"])
        if summary != shown:
            _say(f"waiting: {summary or 'deciding'} (arbiter explain {job_id})")
            shown = summary
    ignore_nudges()
    try:
        code = subprocess.call(cmd)
    except OSError as exc:
        raise CliError(f"cannot start {cmd[0]}: {exc.strerror or exc}", 127) from None
    return code if code >= 0 else 128 - code


def run_job(client: Client, cmd: list[str], name: str | None, manifest_path: str | None, cooperative: bool) -> int:
    if not cmd:
        raise CliError("give the command after --, e.g. arbiter job run -- python batch.py", 2)
    enclosing = _enclosing_job(client)
    if enclosing is not None:
        if name or manifest_path or cooperative:
            _say(f"warning: --name, --manifest and --cooperative do not apply inside job {enclosing}; it keeps its own")
        return _run_inside(client, enclosing, cmd)
    manifest = build_manifest(cmd, name, manifest_path, cooperative)
    try:
        answer = client.call(Op.JOB_REGISTER, timeout=60, manifest=manifest, cmd=cmd)  # may wait for the probes
        job = answer["job"]
        for warning in answer.get("warnings", []):
            _say(f"warning: {warning}")
    except RequestRefused as exc:
        if exc.code == "GPU_API_UNAVAILABLE":
            # not a failure of the job: it cannot be placed here (health "undetected")
            raise CliError(f"GPU_API_UNAVAILABLE: {exc}", EXIT_UNPLACEABLE) from None
        raise CliError(f"the daemon refused the job: {exc}", 2) from None
    job_id = job["id"]
    _say(f"job {job_id} registered")
    shown: str | None = None
    try:
        while True:
            answer = _call_retrying(client, Op.JOB_WAIT, id=job_id, timeout=2.0)
            if answer["admitted"]:
                admitted = change(None, answer, job_id)[1]
                break
            line, shown = change(shown, answer, job_id)
            if line:
                _say(line)
    except KeyboardInterrupt:
        try:
            client.call(Op.JOB_STOP, id=job_id)
        except (CliError, RequestRefused):
            pass
        return 130
    _say(f"job {job_id} admitted; starting {' '.join(cmd)}")

    started = threading.Event()  # the daemon knows the command's process
    running: list[subprocess.Popen[bytes]] = []  # the command, once started
    asked: list[int] = []  # the stop signals that came

    def stopped_by_daemon() -> bool:
        """Whether the daemon took the stop (it continues a paused command first, then ends it)."""
        try:
            client.call(Op.JOB_STOP, id=job_id, timeout=2.0)
            return True
        except (CliError, RequestRefused, DaemonUnavailable, OSError, ValueError):
            return False

    def on_term(signum: int) -> None:
        # before the daemon knows the command's process, or without the daemon, it is signalled here
        asked.append(signum)
        if started.is_set() and stopped_by_daemon():
            return
        for proc in running:
            proc.send_signal(signum)

    interrupted = threading.Event()

    def on_interrupt() -> None:
        # The terminal sent it to the command too, but a paused command cannot act on it
        # for as long as the pause lasts: the job is stopped, once, as SIGTERM stops it.
        if not interrupted.is_set():
            interrupted.set()
            with contextlib.suppress(OSError):  # the terminal may be gone
                _say(f"interrupted: stopping job {job_id} (continued first if it is paused)")
            on_term(signal.SIGINT)

    # on the relay's thread: this one waits for the command, in a wait the kernel does not
    # break for a signal another thread of this process took
    relay_signals({signal.SIGTERM: lambda: on_term(signal.SIGTERM), signal.SIGINT: on_interrupt})
    env = {**os.environ, CONTROL_ENV: job["control_path"], EVENTS_ENV: job["events_path"], "ARBITER_JOB_ID": job_id}
    ignore_nudges()  # inherited by the command until it installs its own handler
    if asked:  # stopped before its command started: it never starts
        stopped_by_daemon()
        return 128 + asked[0]
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        client.call(Op.JOB_EXITED, id=job_id, exit_code=127)
        raise CliError(f"cannot start {cmd[0]}: {exc.strerror or exc}", 127) from None
    running.append(proc)
    if asked:  # a stop came while it started
        proc.send_signal(asked[0])
    try:
        _call_retrying(client, Op.JOB_STARTED, id=job_id, pid=proc.pid)
    except CliError:
        proc.kill()  # never leave a command running that arbiter does not know
        proc.wait()
        raise
    started.set()
    ended = threading.Event()
    watcher = threading.Thread(target=_watch, args=(client, job_id, ended, admitted), name="job-watch", daemon=True)
    watcher.start()
    code = proc.wait()
    ended.set()
    try:
        client.call(Op.JOB_EXITED, id=job_id, exit_code=code)
    except (CliError, RequestRefused, DaemonUnavailable):
        pass  # the daemon notices on its own that the job ended
    watcher.join(timeout=3.0)  # its wait in the daemon ends with the decision on the job's end
    return code if code >= 0 else 128 - code
