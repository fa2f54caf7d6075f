"""The plugin's hook implementations (its entry point): jobs Slurm runs on the node, the node's state in
Slurm's terms, and the ``slurm`` translator.  Apart from the package's ``__init__`` so that
``arbiter-slurm`` (slurmd's Prolog, TaskProlog and Epilog, which Python starts by importing the
package) loads none of it."""

from __future__ import annotations

import logging
from typing import Any

from arbiter.plugin import PluginContext, Register, hookimpl
from arbiter_slurm import commands, nodes, settings
from arbiter_slurm.translator import SlurmTranslator

log = logging.getLogger(__name__)


def scheduler_jobs(node: str) -> list[dict[str, Any]]:
    """Every task Slurm runs on ``node``, as ``arbiter_scheduler_jobs`` reports them."""
    out: list[dict[str, Any]] = []
    for job in commands.jobs_on(node):
        try:
            manifest = commands.manifest_from_comment(job.comment)
        except commands.SlurmError as exc:
            log.warning("Slurm job %s: %s; adopted as plain GPU work", job.key, exc)
            manifest = None
        try:
            tasks = commands.listpids(job.job_id, node)
        except commands.SlurmError as exc:
            log.debug("Slurm job %s: %s", job.job_id, exc)  # ended, or not started here yet
            continue
        for task in tasks:
            if task.local_id is None:
                continue  # a process the task started: its tree is the job's already
            out.append(
                {
                    "id": commands.job_key(job.key, task.step, task.local_id),
                    "uid": job.uid,
                    "pid": task.pid,
                    "manifest": manifest,
                }
            )
    return out


@hookimpl
def arbiter_register_node_sections(register: Register) -> None:
    register(commands.SECTION, settings.NodeOptions)


@hookimpl
def arbiter_scheduler_jobs(node_state: dict[str, Any] | None, context: PluginContext) -> list[dict[str, Any]] | None:
    opts = settings.options(context)
    if not settings.configured(opts):
        return None
    node = settings.node_name(opts)
    if node_state is not None:
        _sync_node(node, node_state, opts)
    return scheduler_jobs(node)


@hookimpl
def arbiter_scheduler_job_owner(job_id: str, context: PluginContext) -> dict[str, Any] | None:
    """Whose ``slurm-…`` job this is, by Slurm's own word: the TaskProlog runs as the job's user,
    so a user who runs it by hand with another job's ``SLURM_JOB_ID`` is not that job's user."""
    if not job_id.startswith(commands.ID_PREFIX):
        return None
    opts = settings.options(context)
    if not settings.configured(opts):
        return {"uid": None, "why": "this node is not under Slurm (no slurm.conf or no Slurm commands)"}
    try:
        job = commands.job_here(job_id, settings.node_name(opts))
    except commands.SlurmError as exc:
        return {"uid": None, "why": str(exc)}
    if job is None:
        return {"uid": None, "why": f"Slurm runs no job {job_id[len(commands.ID_PREFIX) :]} on this node"}
    return {"uid": job.uid, "why": f"Slurm says job {job.job_id} is {job.user or 'uid'} ({job.uid})'s"}


@hookimpl
def arbiter_node_state(state: dict[str, Any], context: PluginContext) -> dict[str, Any] | None:
    """Sync the node, and say which features it has from arbiter (status and metrics show them)."""
    opts = settings.options(context)
    if not settings.configured(opts):
        return None
    node = settings.node_name(opts)
    error = _sync_node(node, state, opts)
    return {"scheduler": "slurm", "node": node, "labels": nodes.features(state), "error": error}


def _sync_node(node: str, state: dict[str, Any], opts: settings.NodeOptions) -> str:
    """Features and drain; a failure is logged and tried again on the next call (every few
    seconds), never in the way of adopting jobs.  Why it failed ("" when it did not)."""
    try:
        for update in nodes.sync(node, state, opts.drain_after_s):
            log.info("Slurm node %s: scontrol update %s", node, " ".join(update))
    except commands.SlurmError as exc:
        log.warning("cannot set Slurm node %s's features or drain: %s", node, exc)
        return f"cannot set the node's features or drain: {exc}"
    return ""


@hookimpl
def arbiter_register_translators(register: Register) -> None:
    register("slurm", SlurmTranslator)
