"""The tests' node: a daemon in a folder of its own, driven as a person would, and waited on.

:class:`HarnessNode` is the demo's node with what tests ask of it: a job's reasons once one
has a code, timeline entries once one is there, and a daemon killed as a crash would.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from arbiter.demo.node import PYTHON, WAIT_S, LocalNode

__all__ = ["PYTHON", "WAIT_S", "HarnessNode"]


class HarnessNode(LocalNode):
    def known_job(self, name: str) -> dict[str, Any]:
        """The job ``name`` in the daemon's status.  ``KeyError`` where there is none yet, which
        :meth:`wait_for` takes as "not yet"."""
        job = self.job(name)
        if job is None:
            raise KeyError(f"the daemon has no job named {name!r}")
        return job

    def cli(
        self, *args: str, timeout: float = 60.0, check: bool = False, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``arbiter ARGS --config CONFIG`` on this node, as a person runs it (``env`` added to
        its environment); what it printed, as text."""
        return subprocess.run(
            [PYTHON, "-m", "arbiter", *args, "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env(), **env},
            check=check,
        )

    def known_rule(self, rule_id: str) -> dict[str, Any]:
        """The rule ``rule_id`` in the daemon's status.  ``KeyError`` where there is none yet,
        which :meth:`wait_for` takes as "not yet"."""
        rule: dict[str, Any] | None = next((r for r in self.status()["rules"] if r["id"] == rule_id), None)
        if rule is None:
            raise KeyError(f"the daemon has no rule {rule_id!r}")
        return rule

    def job_pid(self, name: str, timeout: float = WAIT_S) -> int:
        """The first process of the job ``name``, once the daemon has seen one."""
        pid: int = self.wait_for(lambda: self.known_job(name)["pids"][0], timeout=timeout)
        return pid

    def reasons(self, name: str, code: str, timeout: float = WAIT_S) -> list[dict[str, Any]]:
        """The job's reasons once one has ``code``: the status snapshot is published just after
        the signals are sent, so a process seen stopped may briefly predate its reason."""

        def found() -> list[dict[str, Any]] | None:
            reasons = (self.job(name) or {}).get("reasons") or []
            return reasons if any(r["code"] == code for r in reasons) else None

        try:
            return self.wait_for(found, timeout=timeout)  # type: ignore[no-any-return]
        except TimeoutError as e:
            raise TimeoutError(
                f"job {name!r} never had {code} within {timeout:g}s; it has: {self.job(name)!r}\n{e}"
            ) from None

    def events(
        self, code: str | None = None, subject: str | None = None, contains: str = "", limit: int = 200
    ) -> list[dict[str, Any]]:
        """Timeline entries, waiting until one with ``code`` (and ``contains`` in its message)
        is there: the recorder writes them just after the decision that made them."""

        def found() -> list[dict[str, Any]] | None:
            events = self.call("timeline", code=code, subject=subject, limit=limit)["events"]
            return (
                events
                if any(contains in e["message"] and (code is None or e["code"] == code) for e in events)
                else None
            )

        return self.wait_for(found)  # type: ignore[no-any-return]

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        self.daemon.kill()
        self.daemon.wait()


def start_up(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``arbiter run`` on ``config``, for a test that expects start-up to be refused: it ends
    within a minute with what it said (a daemon that started instead would time out)."""
    return subprocess.run(
        [PYTHON, "-m", "arbiter", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
