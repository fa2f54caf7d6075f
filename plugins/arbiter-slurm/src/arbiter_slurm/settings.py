"""The node config's ``slurm:`` section (:class:`NodeOptions`), and whether this node is under
Slurm at all.  Apart from :mod:`arbiter_slurm.commands`, which the hooks import: this module
needs the plugin API and pydantic, which the daemon has loaded already and a hook has no use
for (see :mod:`arbiter_slurm.hooks` on why a hook starts light)."""

from __future__ import annotations

import os
import shutil
import socket

from pydantic import Field

from arbiter.plugin import KindOptions, PluginContext
from arbiter_slurm.commands import SECTION

#: where slurm.conf is when $SLURM_CONF does not say
DEFAULT_CONF = "/etc/slurm/slurm.conf"


class NodeOptions(KindOptions):
    """The node config's ``slurm:`` section: this node in Slurm's terms."""

    node: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="this node's name in slurm.conf (NodeName); default: the short host name, as slurmd's",
    )
    drain_after_s: float | None = Field(
        300.0,
        ge=0,
        allow_inf_nan=False,
        description="drain the node once protection has held new GPU work this long; null: never drain it",
    )
    checkpoint_signal: str | None = Field(
        None,
        pattern=r"^([BR]:)?(SIG)?[A-Z0-9]+$",
        description="the signal a job is given to save its work before it is requeued, as sbatch's --signal "
        "takes it (B:USR1: the batch shell only); null: the job's own #SBATCH --signal, else none. The "
        "evicting rule's eviction.checkpoint_signal comes first",
    )
    checkpoint_s: float = Field(
        10.0,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="the longest a job given its checkpoint signal runs on before it is requeued (the evicting "
        "rule's eviction.checkpoint_s comes first)",
    )
    requeue_grace_s: float = Field(
        5.0,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="how long a requeued job's processes here may take to end on Slurm's SIGTERM before "
        "they are killed",
    )


def options(context: PluginContext) -> NodeOptions:
    """The node config's ``slurm:`` section, as the daemon validated it (defaults without one)."""
    given = context.sections.get(SECTION)
    return given if isinstance(given, NodeOptions) else NodeOptions()


def configured(opts: NodeOptions) -> bool:
    """Whether this node is under Slurm: its commands are installed, and the node config names
    its Slurm node or the host has a slurm.conf."""
    if shutil.which("squeue") is None or shutil.which("scontrol") is None:
        return False
    return bool(opts.node) or os.path.exists(os.environ.get("SLURM_CONF") or DEFAULT_CONF)


def node_name(opts: NodeOptions) -> str:
    """This node's Slurm name: ``slurm.node``, else the short host name (slurmd's default)."""
    return opts.node or socket.gethostname().split(".")[0]
