"""``arbiter-slurm``: slurm.conf's Prolog, TaskProlog and Epilog.

slurm.conf names a program without arguments, so one program serves all three: what it
does comes from ``$SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd``, ``prolog_task``,
``epilog_slurmd``), or from its first argument (``arbiter-slurm taskprolog``).

It always exits 0 and quickly: a Prolog or Epilog that fails drains the node, and a task
waits for its TaskProlog.  What went wrong goes to standard error (the slurmd log for the
Prolog and Epilog, the job's error file for the TaskProlog).

- **TaskProlog** (as the job's user, its parent is the task about to start): hands the task
  to the local daemon as job ``slurm-<job id>`` (``slurm-<job>.<step>.<task>`` for tasks of
  other steps), which answers once its decision on the task is carried out (a task held is
  stopped before it runs), and exports ``ARBITER_CONTROL``, ``ARBITER_EVENTS`` and ``ARBITER_JOB_ID`` to
  it.  Its manifest: ``$ARBITER_MANIFEST`` (a file, or the JSON itself), else the job's
  comment (``--comment 'arbiter:{...}'``), else plain shared GPU work.
- **Epilog** (as root, after the job's processes have ended on the node): ends the job's
  arbiter jobs there at once, without waiting for the daemon to notice.
- **Prolog** (as root, before the job starts): checks that the daemon answers and says so in
  the slurmd log when it does not (the job then runs without arbiter knowing it).

Each hook starts light: slurmd waits for the Epilog before a requeued job may be placed
again, and a task waits for its TaskProlog, so what it imports is on the path of every job's
start and every requeue.  It imports the daemon's client and :mod:`arbiter_slurm.commands`,
not the plugin API (pydantic, the engine), which would cost it a few tenths of a second on an
idle node and a second on a busy one; the plugin's hooks are :mod:`arbiter_slurm.plugin`.

Which daemon: where several slurmd run on one host, each node's config is the one whose
``slurm: {node: ...}`` names the node (else ``<node>.yaml``), in ``$ARBITER_SLURM_CONFIGS``
or in the folder ``arbiter/`` beside slurm.conf; otherwise the node config arbiter finds
itself (``$ARBITER_CONFIG``, then the default places).  A node config found in such a
folder is followed only when it and every folder above it are root's and writable by no one
else, as the daemon wants its ``state_dir``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from arbiter.api.transport import DaemonUnavailable, RequestRefused, request
from arbiter.cli.client import CliError, daemon_info, state_dir_for
from arbiter.config.safety import command_file_problem
from arbiter.runtime.children import run_child
from arbiter_slurm import commands

CONFIGS_ENV = "ARBITER_SLURM_CONFIGS"
MANIFEST_ENV = "ARBITER_MANIFEST"
#: the longest a hook waits for the daemon: a task waits for its TaskProlog
CALL_TIMEOUT_S = 5.0
#: the most of a node config a hook reads, looking for its node (a config is a few hundred bytes)
CONFIG_MOST = 1 << 20
ROLES = {"prolog_slurmd": "prolog", "prolog_task": "taskprolog", "epilog_slurmd": "epilog"}
#: what a failure means, per role
AFTER = {
    "taskprolog": " (the job runs without arbiter knowing it until the daemon reconciles)",
    "prolog": " (the job will run without arbiter knowing it while the daemon is not there)",
    "epilog": " (the daemon ends the job once it sees its processes gone)",
}


HELP = """usage: arbiter-slurm [prolog | taskprolog | epilog]

slurm.conf's Prolog, TaskProlog and Epilog for arbiter (name this program for all three):

  Prolog=/path/to/arbiter-slurm
  TaskProlog=/path/to/arbiter-slurm
  Epilog=/path/to/arbiter-slurm

Without an argument the role comes from $SLURM_SCRIPT_CONTEXT, as slurmd sets it.

  taskprolog  hand the task about to start to the node's arbiter daemon (as slurm-<job id>,
              slurm-<array job>_<task> for a task of an array) and export ARBITER_JOB_ID,
              ARBITER_CONTROL and ARBITER_EVENTS to it
  epilog      end the job's arbiter jobs on this node at once
  prolog      check that the node's daemon answers, and say so in slurmd's log when not

It always exits 0 (a failing Prolog or Epilog drains the node) and writes what went wrong to
standard error.  Which daemon: the node config in $ARBITER_SLURM_CONFIGS (or arbiter/ beside
slurm.conf) whose slurm.node names $SLURMD_NODENAME, else the node config arbiter finds itself.
See docs/fleet-slurm.md."""


class HookError(Exception):
    pass


def _say(role: str, message: str) -> None:
    line = f"arbiter-slurm {role}: {message}".replace("\n", " ")
    print(line, file=sys.stderr, flush=True)
    if role == "taskprolog":
        print(f"print {line}", flush=True)  # a TaskProlog's "print" lines go to the task's output


def node_config(env: dict[str, str]) -> str | None:
    """The node config of the node this hook runs on, where one is kept per node (several
    slurmd on one host): in the folder, the file whose ``slurm.node`` names it, else
    ``<node>.yaml``; None for the one arbiter finds itself.  slurmd gives the Prolog and
    Epilog only Slurm's variables, so the folder beside slurm.conf serves them."""
    node = env.get("SLURMD_NODENAME")
    if not node:
        return None
    folders = [env.get(CONFIGS_ENV)]
    if env.get("SLURM_CONF"):
        folders.append(str(Path(env["SLURM_CONF"]).parent / "arbiter"))
    for folder in folders:
        if not folder or not Path(folder).is_dir():
            continue
        named = sorted(p for p in Path(folder).glob("*.yaml") if _slurm_node(p) == node)
        if named:
            return _trusted(str(named[0]))
        if (Path(folder) / f"{node}.yaml").is_file():
            return _trusted(str(Path(folder) / f"{node}.yaml"))
    return None


def _trusted(config: str) -> str:
    """``config``, when it and every folder above it are root's (or this account's) and
    writable by no one else, as the daemon wants its state_dir: the Prolog and Epilog run as
    root, and a config another account wrote would send them to a daemon of its choosing."""
    problem = command_file_problem(config)
    if problem:
        raise HookError(
            f"the node config {config} is not safe to follow: {problem}; make it and its folders owned by root "
            "and writable by no one else (chown root; chmod go-w)"
        )
    return config


def _slurm_node(path: Path) -> str | None:
    """The ``slurm.node`` a node config names (None where it names none or cannot be read).
    Only a plain file is read, and only its first ``CONFIG_MOST`` bytes: a pipe or a device
    under a config's name must not hang a hook (a Prolog that hangs drains the node)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = yaml.safe_load(os.read(fd, CONFIG_MOST).decode("utf-8"))
        finally:
            os.close(fd)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    section = data.get(commands.SECTION) if isinstance(data, dict) else None
    node = section.get("node") if isinstance(section, dict) else None
    return str(node) if node else None


def socket_path(env: dict[str, str]) -> str:
    """The local daemon's socket, for the node this hook runs on."""
    config = node_config(env)
    try:
        return str(daemon_info(state_dir_for(config))["socket"])
    except CliError as exc:
        raise HookError(str(exc)) from None


def call(env: dict[str, str], op: str, **args: Any) -> dict[str, Any]:
    try:
        return request(socket_path(env), op, timeout=CALL_TIMEOUT_S, **args)
    except (DaemonUnavailable, RequestRefused) as exc:
        raise HookError(f"{op}: {exc}") from None


def manifest_for(env: dict[str, str], job_id: str) -> dict[str, Any] | None:
    """The manifest the job gave: ``$ARBITER_MANIFEST``, else its comment; None for none."""
    given = (env.get(MANIFEST_ENV) or "").strip()
    if given:
        where = f"${MANIFEST_ENV}"
        try:
            if given.startswith("{"):
                value = json.loads(given)
            else:
                where = given
                value = yaml.safe_load(Path(given).read_text())
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise HookError(f"cannot read the job manifest from {where}: {exc}") from None
        if not isinstance(value, dict):
            raise HookError(f"the job manifest in {where} must be a mapping")
        return value
    try:
        jobs = commands.parse_squeue(commands.run(["squeue", "--json", "--jobs", job_id], runner=run_child))
    except commands.SlurmError as exc:
        raise HookError(f"cannot read job {job_id}'s comment: {exc}") from None
    for job in jobs:
        if job.key == job_id:
            try:
                return commands.manifest_from_comment(job.comment)
            except commands.SlurmError as exc:
                raise HookError(str(exc)) from None
    return None


def taskprolog(env: dict[str, str], parent_pid: int) -> list[str]:
    """Hand the task to the daemon; the lines to print (``export NAME=value``)."""
    job_id = commands.id_from_env(env)
    if not commands.valid_job_id(job_id):
        raise HookError(f"SLURM_JOB_ID is {job_id!r}: not run by slurmstepd as a TaskProlog?")
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "batch"
    local = env.get("SLURM_LOCALID", "0")
    key = commands.job_key(job_id, step, int(local) if local.isdigit() else 0)
    try:
        manifest = manifest_for(env, job_id)
    except HookError as exc:
        _say("taskprolog", f"{exc}; the job runs as plain shared GPU work")
        manifest = None
    try:
        answer = call(env, "job.adopt", id=key, pid=parent_pid, manifest=manifest)
    except HookError as exc:
        if manifest is None or ("BAD_MANIFEST" not in str(exc) and "invalid job manifest" not in str(exc)):
            raise
        _say("taskprolog", f"{exc}; the job runs as plain shared GPU work")
        answer = call(env, "job.adopt", id=key, pid=parent_pid, manifest=None)
    job, verdict = answer["job"], answer.get("verdict") or {}
    if verdict.get("state") == "paused" and verdict.get("reasons"):
        # the task is stopped already (the daemon answers once it is): its output says why
        why = verdict["reasons"][0]
        _say("taskprolog", f"held on this node: {why['message']} ({why['code']}); `arbiter explain {job['id']}`")
    return [
        f"export ARBITER_JOB_ID={job['id']}",
        f"export ARBITER_CONTROL={job['control_path']}",
        f"export ARBITER_EVENTS={job['events_path']}",
    ]


def epilog(env: dict[str, str]) -> list[str]:
    """End the job's arbiter jobs on this node; their ids."""
    job_id = commands.id_from_env(env)
    if not commands.valid_job_id(job_id):
        raise HookError(f"SLURM_JOB_ID is {job_id!r}: not run by slurmd as an Epilog?")
    jobs = call(env, "status")["status"].get("jobs") or []
    mine = [
        j["id"] for j in jobs if j.get("id") == f"slurm-{job_id}" or str(j.get("id")).startswith(f"slurm-{job_id}.")
    ]
    ended = []
    for key in mine:
        try:
            call(env, "job.exited", id=key, exit_code=None)
            ended.append(key)
        except HookError as exc:
            if "NO_SUCH_JOB" not in str(exc) and "no running job" not in str(exc):
                raise
    return ended


def prolog(env: dict[str, str]) -> None:
    call(env, "ping")


def run_role(role: str, env: dict[str, str], parent_pid: int) -> list[str]:
    if role == "taskprolog":
        return taskprolog(env, parent_pid)
    if role == "epilog":
        epilog(env)
    elif role == "prolog":
        prolog(env)
    else:
        raise HookError(f"unknown role {role!r}: give prolog, taskprolog or epilog")
    return []


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help", "help"):
        print(HELP)
        sys.exit(0)
    env = dict(os.environ)
    role = args[0] if args else ROLES.get(env.get("SLURM_SCRIPT_CONTEXT", ""), "")
    try:
        for line in run_role(role, env, os.getppid()):
            print(line, flush=True)
    except HookError as exc:
        job = env.get("SLURM_JOB_ID", "?")
        after = AFTER.get(role, "")
        _say(role or "?", f"job {job}: {exc}{after}")
    except Exception as exc:  # a hook never fails the job or drains the node
        _say(role or "?", f"{type(exc).__name__}: {exc}")
    sys.exit(0)
