"""The pure core: decisions as functions of (observation, previous state, policy, now)."""

from arbiter.engine.decide import decide
from arbiter.engine.types import Decision, EngineState, Observation, Policy

__all__ = ["Decision", "EngineState", "Observation", "Policy", "decide"]
