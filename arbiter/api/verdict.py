"""What ``arbiter job run`` shows of a job's verdict, as one text both sides of the socket
make alike: the command's watcher hands the daemon the mark it shows, and the daemon answers
once the job's verdict has another (``job.wait``'s ``unless``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def verdict_mark(answer: Mapping[str, Any]) -> str:
    """A ``job.wait`` answer's state, its duty while it runs (to two places) and the codes
    holding the job: a line is worth printing when this changes, not when a message only
    restates a figure."""
    state = str(answer["state"])
    duty = f"{round(float(answer.get('duty') or 0.0), 2):g}" if state == "run" else ""
    codes = ",".join(str(reason["code"]) for reason in answer["reasons"])
    return f"{state}/{duty}/{codes}"


def marked_state(mark: str | None) -> str | None:
    """The state a mark was made from."""
    return None if mark is None else mark.split("/", 1)[0]
