"""The job-side SDK (standard library only, vendorable): :mod:`arbiter.sdk.control` (the
control document), :mod:`arbiter.sdk.duty` (holding a duty inside the job) and
:mod:`arbiter.sdk.supervisor` (running a third-party workload)."""

from .control import CONTROL_ENV, EVENTS_ENV, Control, Stopped
from .duty import Duty
from .supervisor import Supervisor

__all__ = ["CONTROL_ENV", "EVENTS_ENV", "Control", "Duty", "Stopped", "Supervisor"]
