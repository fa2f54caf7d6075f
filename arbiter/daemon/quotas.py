"""What one account may hold of the daemon: the daemon's resources are shared by every
local account, and one of them registering jobs in bulk must not take the descriptors,
memory or time the daemon needs to pause work for a protected program."""

from __future__ import annotations

import os

from arbiter.config.models import QuotaConfig
from arbiter.daemon.jobs import JobRegistry


def exempt(uid: int) -> bool:
    """Root and the daemon's own account run the machine: no quota binds them."""
    return uid in (0, os.geteuid())


def job_quota_problem(quotas: QuotaConfig, jobs: JobRegistry, uid: int, cmd: list[str]) -> str | None:
    """Why ``uid`` may not register a job with ``cmd`` now, or None."""
    size = sum(len(word.encode("utf-8", "surrogatepass")) for word in cmd)
    if size > quotas.cmd_bytes:
        return (
            f"the command line is {size} bytes, more than quotas.cmd_bytes ({quotas.cmd_bytes}); "
            "pass long inputs in a file instead"
        )
    if exempt(uid):
        return None
    held = sum(1 for record in jobs.active() if record.owner_uid == uid)
    rate = rate_problem(quotas, jobs, uid)
    if rate:
        return rate
    if held >= quotas.jobs_per_uid:
        return (
            f"uid {uid} has {held} jobs registered and not ended, the most quotas.jobs_per_uid allows; "
            "wait for some to end (`arbiter status` lists them) or ask the machine's administrator to raise it"
        )
    return None


def rate_problem(quotas: QuotaConfig, jobs: JobRegistry, uid: int) -> str | None:
    """Why ``uid`` may not register or hand over another job this minute, or None: short-lived
    jobs in a loop each leave a record and a folder behind."""
    if exempt(uid):
        return None
    recent = jobs.registered_within(uid, 60.0)
    if recent >= quotas.registrations_per_minute:
        return (
            f"uid {uid} registered {recent} jobs within the last minute, the most quotas.registrations_per_minute "
            "allows; wait a minute, or run many short commands as one job"
        )
    return None
