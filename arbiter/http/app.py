"""The FastAPI application.  It reads through a provider, so tests can serve it without a
daemon and the daemon can serve it from a thread."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any, Protocol

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from arbiter import __version__


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


def is_loopback_host(host_header: str | None) -> bool:
    """Whether a Host header names this machine's loopback (guards against DNS rebinding)."""
    if not host_header:
        return False
    host = host_header.strip()
    if host.startswith("["):
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(provider: Provider) -> FastAPI:
    app = FastAPI(
        title="arbiter",
        version=__version__,
        description="Status, reasons and timeline of a node's GPU sharing. Read-only; mutations need the token.",
    )

    def require_token(request: Request, authorization: str | None = Header(default=None)) -> None:
        if not is_loopback_host(request.headers.get("host")):
            raise HTTPException(403, "mutations are accepted only with a loopback Host header")
        expected = f"Bearer {provider.token}"
        if not authorization or not hmac.compare_digest(authorization.encode(), expected.encode()):
            raise HTTPException(401, "send the token from $state_dir/token as 'Authorization: Bearer TOKEN'")

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    @app.get("/v1/status")
    def status() -> dict[str, Any]:
        return provider.status()

    @app.get("/v1/explain")
    def explain(subject: str | None = Query(default=None, description="a job id, job name or tenant (rule id)")) -> dict[str, Any]:
        try:
            return provider.explain(subject)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/v1/timeline")
    def timeline(
        limit: int = Query(default=50, ge=1, le=10_000), subject: str | None = None, code: str | None = None
    ) -> list[dict[str, Any]]:
        return provider.timeline(limit, subject, code)

    @app.get("/v1/gpu-apis")
    def gpu_apis() -> dict[str, Any]:
        return provider.gpu_apis()

    @app.get("/v1/duty")
    def duty() -> dict[str, Any]:
        return provider.duty()

    @app.get("/v1/ab")
    def ab_runs() -> list[dict[str, Any]]:
        return provider.ab_runs()

    def ab_report(run_id: str) -> dict[str, Any]:
        try:
            return provider.ab_report(run_id)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/v1/ab/{run_id}")
    def ab_show(run_id: str) -> dict[str, Any]:
        return ab_report(run_id)

    @app.get("/v1/ab/{run_id}/plot", response_class=Response,
             responses={200: {"content": {"image/png": {}}, "description": "each block's OFF and ON rate, and R"}})
    def ab_plot(run_id: str) -> Response:
        try:
            return Response(provider.ab_plot(run_id), media_type="image/png")
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.post("/v1/reload", dependencies=[Depends(require_token)])
    def reload() -> dict[str, str]:
        provider.reload()
        return {"status": "reloading"}

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return render_page(provider.status())

    return app


def render_page(status: dict[str, Any]) -> str:
    from html import escape

    rows = []
    for job in status.get("jobs", []):
        why = "; ".join(f"{r['code']}: {r['message']}" for r in job.get("reasons", []))
        rows.append(f"<tr><td>{escape(job['id'])}</td><td>{escape(job['state'])}</td><td>{job['duty']:.2f}</td><td>{escape(why)}</td></tr>")
    tenants = []
    for rule in status.get("rules", []):
        share = "unreadable" if rule["gpu_share"] is None else f"{100 * rule['gpu_share']:.0f}%"
        tenants.append(
            f"<tr><td>{escape(rule['id'])}</td><td>{'yes' if rule['running'] else 'no'}</td>"
            f"<td>{share}</td><td>{'yes' if rule['using_gpu'] else 'no'}</td></tr>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>"
        f"<title>arbiter</title></head><body><h1>arbiter {escape(status.get('version', ''))}</h1>"
        f"<p>gpu_jobs: {escape(status.get('gpu_jobs', ''))}</p>"
        "<h2>Jobs</h2><table><tr><th>job</th><th>state</th><th>duty</th><th>why</th></tr>"
        + "".join(rows)
        + "</table><h2>Tenants</h2><table><tr><th>rule</th><th>running</th><th>GPU</th><th>uses GPU</th></tr>"
        + "".join(tenants)
        + "</table></body></html>"
    )
