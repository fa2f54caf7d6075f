"""When deciding again would give the same decision: a decision at rest, on an input that did not move.

The decision is a function of the observation, the previous state, the policy and the time.
The time counts only through the clocks the state keeps running: a grace period, an
eviction's wait, a job's compliance sample, a name's untrusted spell, a governor's period, a
paired run's windows, a tenant's quiet period or release, a protected program's release
after it stopped using the GPU.  A decision that changed nothing, asked nothing and left no
such clock running is one that the same observation, at any later time, gives again; the
decision thread then keeps it instead of deciding again on every tick of a quiet node.
"""

from __future__ import annotations

from dataclasses import fields, replace

from arbiter.engine.types import Decision, EngineState, Observation, Policy, TenantVramState

#: a tenant's handoff record's times: any of them set is a clock that runs (``idle_since``
#: only where its rule releases VRAM after an idle spell)
_VRAM_CLOCKS = tuple(
    f.name
    for f in fields(TenantVramState)
    if f.name.endswith(("_since", "_at", "_due")) and f.default is None and f.name != "idle_since"
)


def _clock_runs(rule_id: str, st: TenantVramState, policy: Policy) -> bool:
    if any(getattr(st, name) is not None for name in _VRAM_CLOCKS):
        return True
    rp = policy.rules.get(rule_id)
    releases_idle = rp is None or (rp.reclaimable and rp.idle_release_after_s is not None)
    return st.idle_since is not None and releases_idle


def at_rest(before: EngineState, decision: Decision, policy: Policy) -> bool:
    """Whether ``decision``, made from ``before`` under ``policy``, is one that time alone
    cannot change."""
    state = decision.state
    if (
        state != before
        or decision.actions
        or decision.events
        or decision.releases
        or decision.profiles_on
        or decision.profiles_off
        or decision.ab_ended
    ):
        return False  # it did something, or moved on: the next one may do more
    if state.jobs or state.compliance or state.held or state.trust or state.governors:
        return False  # grace periods, evictions, duty samples, untrusted spells, budgets run on the clock
    if state.ab is not None and state.ab.running:
        return False  # a paired run's windows and blocks
    if any(rs.using_gpu for rs in state.rules.values()):
        return False  # released only once it has been idle long enough
    return not any(_clock_runs(rid, st, policy) for rid, st in state.vram.items())


def same_input(now: Observation, then: Observation) -> bool:
    """Whether two observations give the same decision from a state at rest: all but their
    times, and what only a governor or a paired run reads (neither runs at rest)."""
    return replace(now, now=0.0, wall=None, memory_available=None, power=None) == replace(
        then, now=0.0, wall=None, memory_available=None, power=None
    )
