"""Hook specifications: every hook a plugin may implement.

Family hooks receive ``register(name, cls)``: call it once per kind the plugin provides.
``name`` is the ``kind:`` used in rule files and the node config; ``cls`` subclasses the
family's base class in :mod:`arbiter.plugin`.  Registering a name another plugin already
registered is an error that names both plugins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

from arbiter.plugin import PROJECT, PluginContext, ProcessInfo, Register

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def arbiter_register_matchers(register: Register) -> None:
    """Register matcher kinds (select the processes of a rule's ``match:`` block).

    :param register: ``register(name, cls)`` with ``cls`` a subclass of
        :class:`arbiter.plugin.Matcher`.
    """


@hookspec
def arbiter_register_sources(register: Register) -> None:
    """Register source kinds (a protected program's progress and phase).

    :param register: ``register(name, cls)`` with ``cls`` a subclass of
        :class:`arbiter.plugin.Source`.
    """


@hookspec
def arbiter_register_readers(register: Register) -> None:
    """Register reader kinds (per-process GPU busy time and VRAM; device VRAM).

    :param register: ``register(name, cls)`` with ``cls`` a subclass of
        :class:`arbiter.plugin.Reader`.
    """


@hookspec
def arbiter_register_probes(register: Register) -> None:
    """Register probe kinds (is a GPU API usable here, with evidence).

    :param register: ``register(name, cls)`` with ``cls`` a subclass of
        :class:`arbiter.plugin.Probe`.
    """


@hookspec
def arbiter_register_translators(register: Register) -> None:
    """Register translator kinds (apply pause, resume, control, stop to programs).

    :param register: ``register(name, cls)`` with ``cls`` a subclass of
        :class:`arbiter.plugin.Translator`.
    """


@hookspec
def arbiter_register_host(register: Register) -> None:
    """Register host signal kinds (available memory, power source, sleep).

    :param register: ``register(name, cls)`` with ``cls`` a subclass of
        :class:`arbiter.plugin.HostSignal`.
    """


@hookspec
def arbiter_register_node_sections(register: Register) -> None:
    """Register sections of the node config (``arbiter.yaml``) that the plugin reads its
    node-wide options from: ``slurm: {node: n1}`` at the top level of the file.

    :param register: ``register(name, model)`` with ``name`` the section's key (lower-case
        letters, digits and ``_``; not a key the node config has already, nor one so close to
        one that a misspelling of it would read as the section) and ``model`` a
        subclass of :class:`arbiter.plugin.KindOptions` (strict: unknown keys are errors).

    The section is validated against ``model`` wherever the node config is judged (``arbiter
    check``, ``arbiter doctor``, the daemon's start): a wrong value or a misspelt key is
    reported at its line, with the keys the model takes.  A top-level key that neither the node
    config nor an enabled plugin knows is an error that lists both.  The plugin receives the
    validated options as ``context.sections[name]`` (:class:`arbiter.plugin.PluginContext`),
    in its kinds and in the hooks that take a ``context``; with the section left out, the
    model's defaults.  Registering a name another plugin already registered is an error that
    names both plugins.
    """


@hookspec(firstresult=True)
def arbiter_process_table(scratch: dict[str, Any]) -> list[ProcessInfo] | None:
    """Return every process on the host, as far as the daemon's account can see them.

    :param scratch: a dict the caller keeps from one call to the next (one per daemon), for
        an implementation to remember what its last scan read, under a key of its own, so that
        it need not re-read what cannot have changed.  It may be called from several threads.
        When the caller stops, it calls ``close()`` on each value in it that has one (a child
        process or open files that an implementation keeps there end then).
        An implementation may keep one line under ``"about"`` saying how it reads the table
        now (``arbiter doctor`` shows it): what a scan costs depends on it.

    firstresult: the first plugin that returns a list wins.  Called on the tick only,
    never on the fast path.
    """


@hookspec(firstresult=True)
def arbiter_watch_processes(
    groups: list[frozenset[int]],
    ended: Callable[[frozenset[int]], None],
    starts: Callable[[ProcessInfo], bool] | None,
    started: Callable[[], None],
    scratch: dict[str, Any],
) -> bool | None:
    """Watch the rules' processes for their end and for a program's start, so that the daemon
    looks again the moment a protected program has ended (and fleet work may run) or started
    (and fleet work is to stop) rather than at its next tick.

    :param groups: sets of pids, each the processes of a rule whose program runs and has
        kept the same processes over the last two ticks; they replace what the last call
        asked for.  An implementation may leave some to the tick (a group too large to watch,
        say): a missed end only waits for the tick.
    :param ended: to call, from any thread, with the pids of a group once every process of it
        has ended (every thread of it: a process that waits for its parent as a zombie has
        ended); once per group for as long as later calls keep asking for it.  It only asks
        for a tick and returns at once.  Every call passes the same one.
    :param starts: whether a program just started (a process as the process table gives it)
        is one that a rule whose program does not run now would select; None when none is
        worth a look.  It replaces the last call's, is cheap, and may be called from any one
        thread at a time.  A program that ran too briefly to be read need not be told of.
    :param started: to call, from any thread, once a program ``starts`` selects has started.
        It only asks for a tick (at most one in ``tick_s`` is brought forward) and returns at
        once.  Every call passes the same one.
    :param scratch: the dict ``arbiter_process_table`` receives, for the implementation to keep
        its watchers in under keys of its own (their ``close()`` is called when the daemon
        stops).

    firstresult: return True where either is watched, None where neither can be here (the
    tick then notices each end and start).  Called on the tick, when the groups or ``starts``
    changed; it must return at once.
    """


@hookspec
def arbiter_fast_thread(role: str) -> str | None:
    """Ask the host to run the calling thread as soon as it wakes.

    :param role: what the thread does: ``"decide"`` (the decision thread, which acts on a
        phase change the reflex process does not), or ``"source RULE/SLOT"`` (a watcher that
        reports a phase of an ``immediate`` rule, in the daemon or in the reflex process).

    The thread carries a phase change to a paused job (within a millisecond or two) and
    mostly sleeps; on a busy host most of its delay is waiting for a
    core.  An implementation may ask the OS scheduler for less of that wait, never for more
    than the thread's fair share of the CPU nor for any privilege, and must return at once.
    Called on that thread, once, before its first fast-path work (a source's watcher: at its
    first report); an exception is logged and the thread goes on.  Return what was done, or
    why nothing could be, in a few words (``status`` shows it under ``fast_path.threads``);
    None when the plugin has nothing to say on this host.
    """


@hookspec
def arbiter_timeline_event(event: dict[str, Any]) -> None:
    """Observe a timeline entry after it has been recorded (for exporters).

    :param event: ``{"t", "code", "subject", "message", "data"}``; do not modify it.
        Called on the recording thread; a slow observer delays recording, never decisions.
    """


@hookspec
def arbiter_node_state(state: dict[str, Any], context: PluginContext) -> dict[str, Any] | None:
    """Observe what the node offers fleet schedulers, when it changes and at least every
    minute (for exporters such as a node-feature-discovery label file).

    Return what the scheduler is told, for ``arbiter status``, the status page and the
    metrics to show: ``{"scheduler": its name, "node": this node's name there, "labels": [the
    labels or features it publishes], "error": why publishing failed ("" when it did not)}``;
    or None.

    :param state: ``{"gpu_apis": {"host": [...], "containers": [...]} (None until the probes
        have answered), "gpu_jobs_admitted": bool, "certified_duty": {rule: duty}, "gpu_jobs":
        mode, "held_since": wall time new GPU work has been held since (None while admitted),
        "held_by": [{"rule", "code"}] what holds it, "at": wall time}``; do not modify it.
    :param context: the daemon's :class:`arbiter.plugin.PluginContext` (its state dir, the
        node config's plugin sections).

    Called on the tick thread under the plugin timeout, never on the fast path.
    """


@hookspec
def arbiter_scheduler_jobs(node_state: dict[str, Any] | None, context: PluginContext) -> list[dict[str, Any]] | None:
    """Say which jobs an outside scheduler runs on this node now, for the daemon to adopt
    those it does not know (missed hooks, its own restart).

    :param node_state: what the node offers now, as ``arbiter_node_state`` receives it (None
        before the first decision), for a plugin that keeps the scheduler's view of the node
        in line every few seconds (a scheduler that forgets it when it restarts).
    :param context: the daemon's :class:`arbiter.plugin.PluginContext` (its state dir, the
        node config's plugin sections).

    Return one dict per task: ``{"id": "<scheduler>-<job id>[.<step>...]", "uid": owner uid,
    "pid": the task's first process, "manifest": a job manifest dict or None}``; None when
    this node is not under the plugin's scheduler.  A job the daemon knows under that id with
    another process or owner is ended and the one reported adopted: the scheduler's word wins.
    Called on the tick thread every few seconds under the plugin timeout, never on the fast
    path; an implementation bounds the commands it runs well inside that timeout.
    """


@hookspec(firstresult=True)
def arbiter_scheduler_job_owner(job_id: str, context: PluginContext) -> dict[str, Any] | None:
    """Say whose job ``job_id`` is, when it has your scheduler's form (``<scheduler>-<id>``).

    An account other than root or the daemon's may hand over a process under a scheduler's
    job id (``job.adopt``, from a task hook run as the job's user) only when the scheduler
    says the job is that account's: a hook run by hand with a forged job id takes over
    nothing.

    Return None when ``job_id`` is not one of your scheduler's ids; otherwise
    ``{"uid": the job's user's uid, or None where the scheduler runs no such job here or
    cannot say, "why": what the scheduler said, for the refusal}``.  An id your scheduler's
    form claims is answered even where this node is not under it (``uid`` None): an id
    nobody vouches for is refused.  firstresult: the first plugin that claims the id wins.
    Called on a request thread under the plugin timeout, never on the fast path.

    :param job_id: the arbiter job id the caller asks to hand a process over under.
    :param context: the node's context (its plugin sections among it).
    """


@hookspec(firstresult=True)
def arbiter_listeners(address: str, port: int) -> list[dict[str, Any]] | None:
    """Say which local sockets listen for TCP connections to ``address``:``port`` (an IP
    address), those on a wildcard address included: one ``{"uid": the socket's owner,
    "address": where it listens}`` each; an empty list when none does (another host's
    address, or the program is down); None when this plugin cannot tell.

    The daemon sends a rule's request headers and its actions (a release) only to a socket
    owned by a user that runs the rule's program, and a secret only to one whose user could
    read that secret itself: a local account that binds the port while the program is down
    gets neither.  firstresult.  Called on a plugin's request thread before each request
    that carries them, never on the fast path: it must be cheap.

    :param address: the IP address the rule's URL names.
    :param port: the TCP port the rule's URL names.
    """
