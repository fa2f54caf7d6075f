"""Every operation the daemon answers, and who may ask for it.

The names are what the socket's JSON request line carries in ``op`` and what the CLI asks
with; :class:`arbiter.daemon.api.NodeApi` has one method per name, each declaring beside it
which :class:`Who` may call it, and a test fails for any name without exactly one method.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Op(enum.StrEnum):
    """The operations, by their name on the wire."""

    PING = "ping"
    STATUS = "status"
    EXPLAIN = "explain"
    DOCTOR = "doctor"
    GPU_APIS = "gpu-apis"
    DUTY = "duty"
    CERTIFICATES = "certificates"
    TIMELINE = "timeline"
    METRICS = "metrics"
    RELOAD = "reload"
    JOB_REGISTER = "job.register"
    JOB_ADOPT = "job.adopt"
    JOB_WAIT = "job.wait"
    JOB_STARTED = "job.started"
    JOB_EXITED = "job.exited"
    JOB_STOP = "job.stop"
    JOB_PAUSE = "job.pause"
    JOB_RESUME = "job.resume"
    AB_STATUS = "ab.status"
    AB_SHOW = "ab.show"
    AB_PLAN = "ab.plan"
    AB_START = "ab.start"
    AB_SWEEP = "ab.sweep"
    AB_ABORT = "ab.abort"

    @property
    def method(self) -> str:
        """The name of the table's method that carries it out (``job.register`` → ``job_register``)."""
        return self.value.replace(".", "_").replace("-", "_")


class Who(enum.Enum):
    """Who may make a request.  Root and the daemon's own account may make every request."""

    #: any local account: reads that show nothing another account must not see
    ANYONE = "any account"
    #: the account that registered the job the request names (``id``)
    JOB_OWNER = "the job's owner"
    #: the account whose process is handed over (the table checks the process and the id)
    PROCESS_OWNER = "the owner of the process handed over"
    #: a member of the node config's ``admin_group``: node-wide changes
    ADMIN = "a member of the admin group"


@dataclass(frozen=True)
class Caller:
    """Who asks on the socket: its peer credentials, never what the request says.  The HTTP
    listener calls the table's methods itself: its reads are anyone's, and its one change
    (reload) needs the daemon's token, which only root and the daemon's account can read."""

    pid: int
    uid: int
