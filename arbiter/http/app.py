"""The FastAPI application.  It reads through a provider, so tests can serve it without a
daemon and the daemon can serve it from a thread."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from arbiter import __version__
from arbiter.http.guard import TOKEN_HINT, LoopbackHostGate, TokenGate, bearer_ok, is_loopback_bind, is_loopback_host
from arbiter.http.provider import Provider


def create_app(provider: Provider, bind_host: str = "127.0.0.1") -> FastAPI:
    """``bind_host`` is the address the app is served on: one other hosts can reach gets
    every request checked for the token (see :mod:`arbiter.http.guard`)."""
    app = FastAPI(
        title="arbiter",
        version=__version__,
        description="Status, reasons and timeline of a node's GPU sharing. Read-only; mutations need the token.",
        # the interactive docs pages load their scripts from a CDN and render blank offline:
        # /docs is a plain page of our own, made from the schema at /openapi.json
        docs_url=None,
        redoc_url=None,
    )
    if is_loopback_bind(bind_host):
        app.add_middleware(LoopbackHostGate)
    else:
        app.add_middleware(TokenGate, token=lambda: provider.token)

    def require_token(request: Request, authorization: str | None = Header(default=None)) -> None:
        if not is_loopback_host(request.headers.get("host")):
            raise HTTPException(403, "mutations are accepted only with a loopback Host header")
        if not bearer_ok(authorization, provider.token):
            raise HTTPException(401, TOKEN_HINT)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    @app.get("/v1/status")
    def status() -> dict[str, Any]:
        return provider.status()

    @app.get("/v1/explain")
    def explain(
        subject: str | None = Query(default=None, description="a job id, job name or tenant (rule id)"),
    ) -> dict[str, Any]:
        try:
            return provider.explain(subject)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/v1/timeline")
    def timeline(
        limit: int = Query(default=50, ge=1, le=10_000), subject: str | None = None, code: str | None = None
    ) -> list[dict[str, Any]]:
        return provider.timeline(limit, subject, code)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition"}},
    )
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        from arbiter.http.metrics import exposition

        return Response(exposition(provider.metrics()), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/gpu-apis")
    def gpu_apis() -> dict[str, Any]:
        return provider.gpu_apis()

    @app.get("/v1/duty")
    def duty() -> dict[str, Any]:
        return provider.duty()

    @app.get("/v1/ab")
    def ab_runs() -> list[dict[str, Any]]:
        return provider.ab_status()

    def ab_report(run_id: str) -> dict[str, Any]:
        try:
            return provider.ab_show(run_id)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/v1/ab/{run_id}")
    def ab_show(run_id: str) -> dict[str, Any]:
        return ab_report(run_id)

    @app.get(
        "/v1/ab/{run_id}/plot",
        response_class=Response,
        responses={200: {"content": {"image/png": {}}, "description": "each block's OFF and ON rate, and R"}},
    )
    def ab_plot(run_id: str) -> Response:
        try:
            return Response(provider.ab_plot(run_id), media_type="image/png")
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None

    @app.post("/v1/reload", dependencies=[Depends(require_token)])
    def reload() -> dict[str, str]:
        provider.reload()
        return {"status": "reloading"}

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    def api_docs() -> str:
        from arbiter.http.apidocs import api_page

        return api_page(app.openapi())

    @app.get("/", response_class=HTMLResponse)
    def page(
        subject: str | None = Query(default=None, description="a job id or tenant: its timeline entries alone"),
    ) -> str:
        import time

        from arbiter.http.page import render_page

        return render_page(provider, time.time(), subject)

    return app
