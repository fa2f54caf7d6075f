"""What the HTTP app reads and asks: the daemon serves it, and tests serve it without one."""

from __future__ import annotations

from typing import Any, Protocol


class Provider(Protocol):
    token: str

    def status(self) -> dict[str, Any]: ...

    def explain(self, subject: str | None) -> dict[str, Any]: ...  # raises LookupError

    def timeline(self, limit: int, subject: str | None, code: str | None) -> list[dict[str, Any]]: ...

    def reload(self) -> None: ...

    def gpu_apis(self) -> dict[str, Any]: ...

    def duty(self) -> dict[str, Any]: ...

    def ab_runs(self) -> list[dict[str, Any]]: ...

    def ab_report(self, run_id: str) -> dict[str, Any]: ...  # raises LookupError

    def ab_plot(self, run_id: str) -> bytes: ...  # raises LookupError

    def metrics(self) -> dict[str, Any]: ...  # what arbiter.http.metrics.families reads
