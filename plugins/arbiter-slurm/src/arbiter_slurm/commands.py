"""Slurm through its own commands (``squeue --json``, ``scontrol listpids``): no Python binding
matches every Slurm release, the commands' output does.  Every call has a timeout and a
failure says which command, how it failed and what Slurm printed.

The hooks import this module: it imports nothing of arbiter's at its top (the node config's
section is :mod:`arbiter_slurm.settings`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: a command that has not answered within this long has failed (the daemon's plugin timeout is 5 s)
TIMEOUT_S = 3.0
#: the node config's section this plugin reads
SECTION = "slurm"
#: a job's manifest in its comment: ``--comment 'arbiter:{"name": "render", ...}'``
COMMENT_PREFIX = "arbiter:"
#: what every arbiter job id of a Slurm task starts with
ID_PREFIX = "slurm-"
#: Slurm job states in which a job has processes on its nodes
LIVE_STATES = ("RUNNING", "SUSPENDED", "COMPLETING")

#: how a Slurm command is started: ``subprocess.run``'s signature
Runner = Callable[..., "subprocess.CompletedProcess[Any]"]

_JOB_ID = re.compile(r"^\d+(_\d+)?$")


class SlurmError(Exception):
    pass


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    uid: int
    user: str
    state: str
    name: str
    comment: str
    requeue: bool
    restart_count: int
    nodes: str = ""  # Slurm's host list: n[1-2]
    array_job_id: int = 0  # an array's task: the array's job id (0 for a job of no array)
    array_task_id: int | None = None
    reason: str = ""  # why a pending job waits (squeue's state_reason: BadConstraints, BeginTime, ...)
    features: str = ""  # the features it asks for (--constraint)

    @property
    def key(self) -> str:
        """The id every command arbiter sends names the job by: ``<array job>_<task>`` for an
        array's task (a bare id there is the whole array to Slurm), else the job id."""
        return task_id(self.job_id, self.array_job_id, self.array_task_id)


@dataclass(frozen=True)
class TaskPid:
    """One line of ``scontrol listpids``: a process of a job step; ``local_id`` is None for a
    process the task started (only the task's own process has one)."""

    pid: int
    job_id: int
    step: str
    local_id: int | None


def run(args: list[str], timeout: float = TIMEOUT_S, runner: Runner | None = None) -> str:
    """Run a Slurm command; its standard output, or a SlurmError saying why not.  The daemon's
    commands start as every child of arbiter's (``run_child``); a hook, which is no part of
    the daemon and must start light, gives its own ``runner``."""
    if runner is None:
        from arbiter.plugin import run_child  # loaded in the daemon already; a hook passes its own

        runner = run_child
    try:
        done = runner(args, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]} is not installed (PATH={os.environ.get('PATH', '')})") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args)}` did not answer within {timeout:g}s (is slurmctld up?)") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"`{' '.join(args)}` failed with exit {done.returncode}: {' / '.join(said)[:400]}")
    return str(done.stdout)


def parse_squeue(text: str) -> list[SlurmJob]:
    """The jobs in ``squeue --json`` output (Slurm 22.05 and later: ``{"jobs": [...]}``)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"squeue --json printed something that is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmError("squeue --json printed no 'jobs' list")
    errors = [e.get("error") or e.get("description") or str(e) for e in data.get("errors") or [] if e]
    if errors:
        raise SlurmError(f"squeue --json reported: {'; '.join(map(str, errors))[:400]}")
    return [_job(j) for j in data["jobs"] if isinstance(j, dict)]


def _state(raw: Any) -> str:
    # 22.05 gives "RUNNING"; later releases give ["RUNNING"] (a list of flags)
    if isinstance(raw, list):
        return str(raw[0]) if raw else ""
    return str(raw or "")


def _number(raw: Any) -> int:
    # later releases wrap numbers: {"set": true, "infinite": false, "number": 3}
    if isinstance(raw, dict):
        raw = raw.get("number", 0)
    return int(raw or 0)


def _job(j: dict[str, Any]) -> SlurmJob:
    return SlurmJob(
        job_id=_number(j.get("job_id")),
        uid=_number(j.get("user_id")),
        user=str(j.get("user_name") or ""),
        state=_state(j.get("job_state")),
        name=str(j.get("name") or ""),
        comment=str(j.get("comment") or ""),
        requeue=bool(j.get("requeue")),
        restart_count=_number(j.get("restart_cnt")),
        nodes=str(j.get("nodes") or ""),
        array_job_id=_number(j.get("array_job_id")),
        array_task_id=None if j.get("array_task_id") is None else _number(j.get("array_task_id")),
        reason=str(j.get("state_reason") or ""),
        features=str(j.get("features") or ""),
    )


def task_id(job_id: int | str, array_job_id: int | str | None, array_task_id: int | str | None) -> str:
    """A job's name in Slurm's commands: ``<array job>_<task>`` for a task of an array (the
    task that keeps the array's own job id included), else the job id."""
    if array_job_id not in (None, "", 0, "0") and array_task_id not in (None, ""):
        return f"{array_job_id}_{array_task_id}"
    return str(job_id)


def id_from_env(env: dict[str, str]) -> str:
    """The job's name in Slurm's commands, from the variables slurmd gives its hooks and tasks."""
    return task_id(env.get("SLURM_JOB_ID", ""), env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID"))


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's host list (``n[1-3,7],gpu01``) as names; a part it cannot read is kept whole."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expr):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not high:
                names.append(f"{prefix}{low}{suffix}")
            elif low.isdigit() and high.isdigit():
                names.extend(f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), int(high) + 1))
            else:
                names.append(part)
    return names


def jobs_on(node: str) -> list[SlurmJob]:
    """The jobs Slurm has on ``node`` that have processes there.  squeue's own filters match
    host names (several slurmd on one host share one) and are not applied by every release's
    ``--json``: the jobs are chosen here by their node list."""
    text = run(["squeue", "--json", "--nodelist", node, "--states", ",".join(LIVE_STATES)])
    return [j for j in parse_squeue(text) if j.state in LIVE_STATES and node in expand_hostlist(j.nodes)]


def job_here(key: str, node: str) -> SlurmJob | None:
    """The live Slurm job on ``node`` that the arbiter job id ``key`` (``slurm-<job>[.<step>.<task>]``)
    names; None where the id is malformed or Slurm runs no such job there."""
    job_id = key[len(ID_PREFIX) :].split(".", 1)[0] if key.startswith(ID_PREFIX) else ""
    if not valid_job_id(job_id):
        return None
    text = run(["squeue", "--json", "--jobs", job_id, "--states", ",".join(LIVE_STATES)])
    for job in parse_squeue(text):
        if job.key == job_id and job.state in LIVE_STATES and node in expand_hostlist(job.nodes):
            return job
    return None


def parse_listpids(text: str) -> list[TaskPid]:
    """``scontrol listpids`` output: a header, then ``PID JOBID STEPID LOCALID GLOBALID``."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[0].isdigit():
            continue  # the header, or a line this parser does not know
        local = int(parts[3]) if parts[3].isdigit() else None
        out.append(TaskPid(int(parts[0]), int(parts[1]) if parts[1].isdigit() else 0, parts[2], local))
    return out


def listpids(job_id: int, node: str) -> list[TaskPid]:
    """The processes of ``job_id`` on ``node`` (run where that node's slurmd is)."""
    return parse_listpids(run(["scontrol", "listpids", str(job_id), node]))


def job_key(job_id: int | str, step: str, local_id: int) -> str:
    """The arbiter job id of one task: ``slurm-<job>`` for the batch script (or a job's first
    task), ``slurm-<job>.<step>.<task>`` for the others."""
    if step in ("batch", "") or (step == "interactive" and local_id == 0):
        return f"slurm-{job_id}"
    return f"slurm-{job_id}.{step}.{local_id}"


def manifest_from_comment(comment: str) -> dict[str, Any] | None:
    """A manifest a job gave in its comment (``arbiter:{json}``), else None."""
    if not comment.startswith(COMMENT_PREFIX):
        return None
    try:
        value = json.loads(comment[len(COMMENT_PREFIX) :])
    except json.JSONDecodeError as exc:
        raise SlurmError(f"the job's comment starts with {COMMENT_PREFIX!r} but is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise SlurmError(f"the job's comment after {COMMENT_PREFIX!r} must be a JSON object")
    return value


def valid_job_id(text: str) -> bool:
    return bool(_JOB_ID.match(text))


@dataclass(frozen=True)
class CheckpointSignal:
    """What a job is given to save its work: ``sbatch --signal=[B:]<sig>[@<time>]``."""

    name: str  # USR1
    batch: bool  # B: the batch shell alone, else every step's tasks

    def scancel(self, job: str) -> list[str]:
        return ["scancel", f"--signal={self.name}", *(["--batch"] if self.batch else []), job]

    def __str__(self) -> str:
        return ("B:" if self.batch else "") + self.name


def parse_signal(text: str) -> CheckpointSignal | None:
    """``[B:|R:]<name or number>[@<seconds>]`` as sbatch's --signal takes it; None when it is not
    one, or names a signal no job can catch (KILL, STOP): given as a checkpoint signal it would
    end or freeze the job rather than let it save its work."""
    spec = text.strip().split("@", 1)[0]
    flags, _, name = spec.rpartition(":")
    if flags not in ("", "B", "R", "BR", "RB"):
        return None
    name = name.upper().removeprefix("SIG")
    if not re.fullmatch(r"[A-Z0-9]+", name):
        return None
    number = int(name) if name.isdigit() else getattr(signal.Signals, f"SIG{name}", None)
    if number in (signal.SIGKILL, signal.SIGSTOP):
        return None
    return CheckpointSignal(name, "B" in flags)


def script_signal(script: str) -> CheckpointSignal | None:
    """The ``#SBATCH --signal=...`` a batch script gives (sbatch reads ``#SBATCH`` lines up to
    the first command), else None."""
    for line in script.splitlines()[1:] if script.startswith("#!") else script.splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            return None
        match = re.search(r"--signal[= ]\s*(\S+)", stripped)
        if match:
            return parse_signal(match.group(1))
    return None


def job_signal(job: str) -> CheckpointSignal | None:
    """The checkpoint signal job ``job``'s own script asks for, else None (a job without a
    script, as ``srun`` starts, included)."""
    try:
        return script_signal(run(["scontrol", "write", "batch_script", job, "-"]))
    except SlurmError:
        return None
