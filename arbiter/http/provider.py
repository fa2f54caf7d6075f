"""What the HTTP app reads and asks: the daemon's table of operations
(:class:`arbiter.daemon.api.NodeApi`) serves it, and tests serve it without a daemon.

Each method is the operation of the same name (:class:`arbiter.api.ops.Op`), called without
a caller: every read is anyone's, and the app asks for the token before ``reload``.
"""

from __future__ import annotations

from typing import Any, Protocol


class Provider(Protocol):
    @property
    def token(self) -> str: ...

    def status(self) -> dict[str, Any]: ...

    def explain(self, subject: str | None, /) -> dict[str, Any]: ...  # raises LookupError

    def timeline(self, limit: int, subject: str | None, code: str | None, /) -> list[dict[str, Any]]: ...

    def reload(self) -> object: ...

    def gpu_apis(self) -> dict[str, Any]: ...

    def duty(self) -> dict[str, Any]: ...

    def ab_status(self) -> list[dict[str, Any]]: ...

    def ab_show(self, run_id: str, /) -> dict[str, Any]: ...  # raises LookupError

    def ab_plot(self, run_id: str, /) -> bytes: ...  # raises LookupError

    def metrics(self) -> dict[str, Any]: ...  # what arbiter.http.metrics.families reads
