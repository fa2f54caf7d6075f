"""``slurm``: arbiter under the Slurm scheduler.

Slurm jobs become arbiter jobs without their users doing anything: slurm.conf's TaskProlog
(``arbiter-slurm``, run as the job's user just before each task starts) hands the task's
process to the local daemon, and the Epilog ends the job there.  Hooks can be missed (the
daemon restarting, a hook timing out), so the daemon also asks this plugin every few seconds
which jobs Slurm runs on this node (``squeue --json``) and which processes they have
(``scontrol listpids``), and adopts what it does not know.  The node's state in Slurm's terms
(features for ``--constraint``, a drain while protection holds GPU work too long) is set on
every change and re-asserted every few seconds (see :mod:`arbiter_slurm.nodes`).

The ``slurm`` translator (``translators: {pause: [slurm], terminate: [slurm]}`` in the node
config) makes a pause one the scheduler sees: see :mod:`arbiter_slurm.translator`.

The node config's ``slurm:`` section (:class:`arbiter_slurm.settings.NodeOptions`) says which
node this is (``node``, else the short host name) and when to drain it (``drain_after_s``).
Which cluster: ``$SLURM_CONF``, Slurm's own variable, else ``/etc/slurm/slurm.conf``; with
neither a node named nor a slurm.conf (or without Slurm's commands), the plugin stays silent.

The package itself imports nothing: the plugin's entry point is :mod:`arbiter_slurm.plugin`, so
that ``arbiter-slurm``, which slurmd runs before every task and after every job, starts light.
"""
