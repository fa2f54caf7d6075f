"""What a Slurm job is to this node: its id from an arbiter job's or from a process's
environment, what Slurm's refusals mean, the signal it saves its work on, and when a requeued
job may start again."""

from __future__ import annotations

import math

from arbiter.plugin import JobTarget
from arbiter_slurm import commands, settings

#: slurmd refuses a job's new start whose credential is dated no later than the second its
#: last run was revoked in: the job would end at once, "Job credential revoked".  Both times are
#: slurmctld's: the revoke is dated as slurmctld builds the kill request of the requeue
#: (``create_kill_job_msg`` sets ``msg->time``, job_mgr.c, 22.05), and slurmd revokes every
#: credential dated at or before it (``slurm_cred_revoke``/``slurm_cred_revoked``, slurm_cred.c).
#: So a requeued job may start from the first whole second after its requeue was answered, and
#: this long past it (slack for this node's clock against slurmctld's); its Epilog usually
#: takes longer, and it is placed the moment it is pending
CREDENTIAL_CLEAR_S = 0.5
#: what Slurm answers for a job with nothing to resume or requeue: it is pending or has ended
NOTHING_TO_DO = (
    "pending execution",
    "not suspended",
    "already completed",
    "invalid job id",
    "job has already finished",
    "already suspended",
)


def slurm_job(job_id: str) -> str | None:
    """The Slurm job id of an arbiter job id (``slurm-17``, ``slurm-17.0.1``, ``slurm-16_3``), else None."""
    if not job_id.startswith("slurm-"):
        return None
    number = job_id.removeprefix("slurm-").split(".", 1)[0]
    return number if commands.valid_job_id(number) else None


def job_of_process(pid: int) -> str | None:
    """The Slurm job a process runs in, from its environment (resumes after a daemon restart
    name processes only)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            items = fh.read().split(b"\0")
    except OSError:
        return None
    env = {}
    for item in items:
        name, _, value = item.partition(b"=")
        if name.startswith(b"SLURM_"):
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    job = commands.id_from_env(env)
    return job if commands.valid_job_id(job) else None


def nothing_to_do(exc: commands.SlurmError) -> bool:
    """Whether Slurm refused because the job is pending or has ended."""
    return any(said in str(exc).lower() for said in NOTHING_TO_DO)


def checkpoint_of(
    target: JobTarget, opts: settings.NodeOptions, key: str
) -> tuple[commands.CheckpointSignal | None, float]:
    """The signal a job about to be requeued is given to save its work, and the longest it
    may take: the evicting rule's ``eviction:`` where it says, else the node's ``slurm:``
    section; the signal, where neither names one, is the job's own ``#SBATCH --signal``."""
    rule = target.checkpoint
    named = (rule.signal if rule is not None else None) or opts.checkpoint_signal
    most_s = rule.seconds if rule is not None and rule.seconds is not None else opts.checkpoint_s
    given = commands.parse_signal(named) if named else None
    return given or commands.job_signal(key), most_s


def credential_wait(requeued_by: float, now: float) -> float:
    """How long a job requeued by ``requeued_by`` (wall time: its requeue answered, or seen done)
    must wait before slurmd accepts its new start (see ``CREDENTIAL_CLEAR_S``); 0 once past."""
    return max(0.0, math.floor(requeued_by) + 1 + CREDENTIAL_CLEAR_S - now)


def running(pid: int) -> bool:
    """Whether the process is there and not stopped (free to run)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("T", "t", "Z", "X")
