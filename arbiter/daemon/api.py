"""The daemon's table of operations: one method per operation, each with who may call it.

The socket dispatches a request line to the method its ``op`` names (:meth:`NodeApi.dispatch`),
after checking the caller's right to it and its arguments against the method's signature;
the HTTP listener calls the same methods (its reads are anyone's, its one change needs the
token); the CLI asks by the names of :class:`arbiter.api.ops.Op`.  A method's parameters are
its typed request: text, numbers, whole numbers, flags, a list of text or a mapping; two
names are given by the table rather than the caller: ``caller`` (who asks) and ``job`` (the
job the request's ``id`` names, once the caller's right to it is checked).

How an operation is declared and its arguments checked is :mod:`arbiter.daemon.operation`;
the operations on jobs are :class:`arbiter.daemon.jobops.JobOperations`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from arbiter import __version__
from arbiter.api.ops import Caller, Op, Who
from arbiter.daemon.jobops import PROBE_WAIT_S, JobOperations, Watchers
from arbiter.daemon.operation import Refused, RunNotFound, arguments, declared, group_members, may_admin, operation
from arbiter.daemon.views import UnknownSubject, duty_view, explain_view, status_view

if TYPE_CHECKING:
    from arbiter.daemon.parts import Parts

#: how often, at most, an account that is not an administrator gets the probes run anew
PROBE_REFRESH_EVERY_S = 60.0
PLOT_TIMEOUT_S = 60.0


# --- the table ------------------------------------------------------------------------------------


class NodeApi(JobOperations):
    """Every operation of the daemon.  Methods read the published snapshot and the
    collaborators' own thread-safe views; changes go to the thread that owns them."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._table = declared(type(self))
        self._plots: dict[str, tuple[str, bytes]] = {}  # run id → (what it showed, its PNG)
        self.watchers = Watchers()

    @property
    def token(self) -> str:
        """What the HTTP listener asks of a change (``reload``)."""
        return self.parts.token

    # --- rights -----------------------------------------------------------------------------

    def is_admin(self, caller: Caller) -> bool:
        return may_admin(caller.uid, self.parts.uid, group_members(self.parts.config.admin_group))

    def dispatch(self, op: str, args: dict[str, Any], peer: tuple[int, int]) -> dict[str, Any]:
        """The socket's answer to one request line from ``peer`` (pid, uid)."""
        try:
            return {"ok": True, **self.call(op, args, Caller(*peer))}
        except Refused as exc:
            return {"ok": False, "error": str(exc), "code": exc.code}
        except UnknownSubject as exc:
            return {"ok": False, "error": str(exc), "code": "UNKNOWN_SUBJECT"}

    def call(self, op: str, args: dict[str, Any], caller: Caller) -> dict[str, Any]:
        try:
            entry = self._table[Op(op)]
        except ValueError:
            raise Refused(f"unknown request {op!r}", "BAD_REQUEST") from None
        decl = entry.declared
        given = arguments(op, entry.params, args, entry.takes_rest)
        if decl.who is Who.ADMIN and not self.is_admin(caller):
            raise Refused(
                f"{op} needs root, the daemon's user or membership of group {self.parts.config.admin_group!r}",
                "FORBIDDEN",
            )
        if entry.wants_caller:
            given["caller"] = caller
        if decl.who is Who.JOB_OWNER:
            given["job"] = self._job_of(op, caller, args, decl.by_name)
        value = entry.method(self, **given)
        return {decl.answer: value} if decl.answer else dict(value)

    # --- reads: anyone ----------------------------------------------------------------------

    @operation(Op.PING, Who.ANYONE, "version")
    def ping(self) -> str:
        return __version__

    @operation(Op.STATUS, Who.ANYONE, "status")
    def status(self) -> dict[str, Any]:
        return status_view(self.parts)

    @operation(Op.EXPLAIN, Who.ANYONE, "explain")
    def explain(self, subject: str | None = None) -> dict[str, Any]:
        """Raises :class:`~arbiter.daemon.views.UnknownSubject` (a LookupError) for an unknown subject."""
        return explain_view(self.parts, subject or None)

    @operation(Op.DUTY, Who.ANYONE, "duty")
    def duty(self) -> dict[str, Any]:
        return duty_view(self.parts)

    @operation(Op.TIMELINE, Who.ANYONE, "events")
    def timeline(self, limit: int = 50, subject: str | None = None, code: str | None = None) -> list[dict[str, Any]]:
        return self.parts.store.timeline(max(1, min(limit, 10_000)), subject, code)

    @operation(Op.CERTIFICATES, Who.ANYONE)
    def certificates(self) -> dict[str, Any]:
        view = self.parts.snapshot.view
        return {
            "certificates": list(self.parts.ticker.certificate_states),
            "node": self.parts.ticker.node_fingerprint(),
            "programs": dict(view.rule_exes) if view else {},
            "fleet": self.parts.fleet.view(),
        }

    @operation(Op.DOCTOR, Who.ANYONE)
    def doctor(self) -> dict[str, Any]:
        from arbiter.daemon.health import daemon_items

        return {"items": [i.to_dict() for i in daemon_items(self.parts)]}

    @operation(Op.GPU_APIS, Who.ANYONE, "gpu_apis")
    def gpu_apis(self, refresh: bool = False, caller: Caller | None = None) -> dict[str, Any]:
        """The probes' last answer; ``refresh`` runs them again (for an account that is not an
        administrator, at most once a while, so no one can keep them running)."""
        prober = self.parts.prober
        if caller is None:  # the HTTP listener: what is there, never a wait
            return prober.get() or {"pending": True, "host": [], "containers": [], "evidence": {}}
        if refresh:
            answer = prober.refresh(PROBE_WAIT_S, 0.0 if self.is_admin(caller) else PROBE_REFRESH_EVERY_S)
        else:
            answer = prober.get(PROBE_WAIT_S)
        if answer is None:
            raise Refused(f"the GPU API probes have not answered within {PROBE_WAIT_S:g}s; ask again", "BUSY")
        return answer

    @operation(Op.METRICS, Who.ANYONE, "metrics")
    def metrics(self) -> dict[str, Any]:
        """What :func:`arbiter.http.metrics.families` reads for one scrape."""
        p = self.parts
        return {
            "status": status_view(p),
            "duty": duty_view(p),
            "gpu_apis": p.prober.answer,
            "events": dict(p.recorder.counts),
            "latency": p.intake.book.histograms(),
            "costs": p.costs(),
        }

    # --- paired runs ------------------------------------------------------------------------

    @operation(Op.AB_STATUS, Who.ANYONE, "runs")
    def ab_status(self) -> list[dict[str, Any]]:
        from arbiter.daemon.abruns import status

        return status(self.parts)

    @operation(Op.AB_SHOW, Who.ANYONE, "report")
    def ab_show(self, id: str) -> dict[str, Any]:
        """Raises :class:`RunNotFound` (a LookupError) for an unknown run."""
        from arbiter.daemon.abruns import RunRefused, find
        from arbiter.harness.report import report

        try:
            return report(*find(self.parts, id))
        except RunRefused as exc:
            raise RunNotFound(str(exc)) from None

    def ab_plot(self, run_id: str) -> bytes:
        """:data:`Op.AB_SHOW`'s report drawn as a PNG, for the HTTP listener alone (a picture
        is no answer for the socket).  Drawn in a child process (matplotlib would hold the GIL
        from the fast path), and kept while the run has not changed."""
        import json
        import subprocess

        from arbiter.runtime.children import python_module, run_child

        rep = self.ab_show(run_id)
        key = json.dumps([rep["status"], len(rep["blocks"]), len(rep["excluded"])])
        cached = self._plots.get(run_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        done: subprocess.CompletedProcess[bytes] = run_child(
            python_module("arbiter.harness.report"),
            input=json.dumps(rep).encode(),
            capture_output=True,
            timeout=PLOT_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise LookupError(f"the plot could not be drawn: {done.stderr.decode(errors='replace')[-300:]}")
        self._plots[run_id] = (key, done.stdout)
        return done.stdout

    def _run_change(self, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        from arbiter.daemon.abruns import RunRefused

        try:
            return fn()
        except RunRefused as exc:
            raise Refused(str(exc), "AB_REFUSED") from None

    def _start(self, settings: dict[str, Any], sweep: bool, caller: Caller, plan_only: bool) -> dict[str, Any]:
        from arbiter.daemon import abruns

        def go() -> dict[str, Any]:
            run_id, sweep_id = abruns.new_ids(sweep)
            run = abruns.spec_from(settings, run_id, sweep_id)
            return abruns.plan(self.parts, run) if plan_only else abruns.start(self.parts, run, caller.uid)

        return self._run_change(go)

    # a run's settings (rule, work, duty, blocks, window, washout, margin, off, max_hours,
    # levels) are checked, with the bounds each has, where the run is made: abruns.spec_from

    @operation(Op.AB_PLAN, Who.ADMIN, "plan")
    def ab_plan(self, caller: Caller, sweep: bool = False, **settings: Any) -> dict[str, Any]:
        """What a paired run would do, checked as a start is, without starting it."""
        return self._start(settings, sweep, caller, plan_only=True)

    @operation(Op.AB_START, Who.ADMIN, "plan")
    def ab_start(self, caller: Caller, sweep: bool = False, **settings: Any) -> dict[str, Any]:
        return self._start(settings, sweep, caller, plan_only=False)

    @operation(Op.AB_SWEEP, Who.ADMIN, "plan")
    def ab_sweep(self, caller: Caller, **settings: Any) -> dict[str, Any]:
        return self._start(settings, True, caller, plan_only=False)

    @operation(Op.AB_ABORT, Who.ADMIN)
    def ab_abort(self, caller: Caller, id: str) -> dict[str, Any]:
        from arbiter.daemon import abruns

        return self._run_change(lambda: abruns.abort(self.parts, id, caller.uid))

    # --- node-wide changes ------------------------------------------------------------------

    @operation(Op.RELOAD, Who.ADMIN)
    def reload(self) -> dict[str, Any]:
        """Read the rule files again at once."""
        self.parts.ticker.reload()
        return {}
