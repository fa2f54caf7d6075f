"""What the last decision saw and said, and the targets made from one view.

The decision thread alone replaces :attr:`Published.snapshot` (whole, after every decision);
every other thread reads it without a lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.observe import TickView
from arbiter.daemon.sharehistory import SharePoint
from arbiter.engine.types import Decision, Observation, Policy
from arbiter.plugin import JobTarget, ProcessRef
from arbiter.state.store import JobRecord


@dataclass(frozen=True)
class Snapshot:
    """The last decision, what it was made on, and the policy it was made under."""

    decision: Decision | None = None
    obs: Observation | None = None
    view: TickView | None = None
    jobs: list[JobRecord] = field(default_factory=list)
    decided_at: float = 0.0
    policy: Policy = field(default_factory=Policy)
    shares: tuple[SharePoint, ...] = ()  # each tenant's GPU share and the jobs' total, one point per tick


class Published:
    """The one place the last snapshot is kept."""

    def __init__(self, policy: Policy) -> None:
        self.snapshot = Snapshot(policy=policy)


class Targets:
    """What a translator acts on for a job in a view, made once per view (on the decision
    thread: its act, and the table it arms the reflex process with)."""

    def __init__(self, jobs: JobRegistry) -> None:
        self.jobs = jobs
        self._made: tuple[TickView | None, dict[tuple[Any, ...], JobTarget]] = (None, {})

    def of(self, record: JobRecord, view: TickView | None) -> JobTarget:
        seen, made = self._made
        if seen is not view:
            made = {}
            self._made = (view, made)
        key = (record.id, record.name, record.root_pid, record.root_start, record.control_path)
        target = made.get(key)
        if target is None:
            refs = view.job_processes.get(record.id) or () if view is not None else ()
            if refs and not record.rooted_at(refs[0].pid, refs[0].start_time):
                # the view's tree is a run of the job's before this record's (a job placed back
                # here by its scheduler, adopted again since the view was read): not this run
                refs = ()
            if not refs and record.root_pid is not None and record.root_start is not None:
                refs = (ProcessRef(record.root_pid, record.root_start),)
            manifest = self.jobs.manifest(record)
            cooperative = bool({"cooperative_pause", "cooperative_throttle"} & set(manifest.capabilities))
            target = made[key] = JobTarget(record.id, record.name, tuple(refs), record.control_path, cooperative)
        return target
