"""The job-side SDK (standard library only): see :mod:`arbiter.sdk.control`."""

from arbiter.sdk.control import CONTROL_ENV, EVENTS_ENV, Control, Stopped

__all__ = ["CONTROL_ENV", "EVENTS_ENV", "Control", "Stopped"]
