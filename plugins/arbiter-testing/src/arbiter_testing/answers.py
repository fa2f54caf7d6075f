"""What the daemon's status endpoint answers, as the command line's views receive it.

Tests of those views build one with :func:`status_answer` and set only the fields they
judge; the rest are those of a daemon with nothing to show.
"""

from __future__ import annotations

from typing import Any


def rule_answer(rule_id: str, **fields: Any) -> dict[str, Any]:
    """One rule's row: a protected program that is not running, unless ``fields`` say so."""
    row: dict[str, Any] = {
        "id": rule_id,
        "priority": 1,
        "protected": True,
        "running": False,
        "gpu_share": None,
        "using_gpu": False,
        "pids": [],
        "phases": [],
        "holds": [],
    }
    return row | fields


def job_answer(job_id: str, state: str = "run", **fields: Any) -> dict[str, Any]:
    """One job's row: running on the GPU at full duty, unless ``fields`` say otherwise."""
    row: dict[str, Any] = {"id": job_id, "state": state, "duty": 1.0, "use": "gpu", "pids": [1], "reasons": []}
    return row | fields


def status_answer(**fields: Any) -> dict[str, Any]:
    """A whole status answer: no rules, no jobs, nothing wrong, unless ``fields`` say otherwise."""
    answer: dict[str, Any] = {
        "version": "0",
        "gpu_jobs": "when_no_gpu_protected",
        "tick_s": 1.0,
        "uptime_s": 1.0,
        "reader": {"name": "cpu_time", "why": ""},
        "processes": 1,
        "scan_ms": 1,
        "fast_path": {"count": 0},
        "rules": [],
        "jobs": [],
        "notices": [],
        "recorder": {"failures": 0},
    }
    return answer | fields
