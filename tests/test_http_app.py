"""The HTTP app: read-only endpoints, and mutations only with the token and a loopback Host."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from arbiter.http.app import create_app
from arbiter.http.guard import is_loopback_host


class FakeProvider:
    token = "s3cret"

    def __init__(self) -> None:
        self.reloads = 0

    def status(self) -> dict[str, Any]:
        return {
            "version": "x",
            "gpu_jobs": "when_no_gpu_protected",
            "rules": [],
            "jobs": [
                {
                    "id": "j1",
                    "state": "paused",
                    "duty": 0.0,
                    "reasons": [{"code": "PROTECTED_GPU_BUSY", "message": "m <b>", "remedy": "r"}],
                }
            ],
        }

    def explain(self, subject: str | None) -> dict[str, Any]:
        if subject == "nope":
            raise LookupError("no job or tenant is called 'nope'")
        return {"subject": subject or "node", "items": []}

    def timeline(self, limit: int, subject: str | None, code: str | None) -> list[dict[str, Any]]:
        return [{"limit": limit, "subject": subject, "code": code}]

    def gpu_apis(self) -> dict[str, Any]:
        return {"host": [], "containers": [], "evidence": {"cuda": "no NVIDIA driver"}}

    def duty(self) -> dict[str, Any]:
        return {"summary": "no governor runs"}

    def reload(self) -> None:
        self.reloads += 1

    def ab_status(self) -> list[dict[str, Any]]:
        return [{"run": "ab-1", "status": "done"}]

    def ab_show(self, run_id: str) -> dict[str, Any]:
        if run_id != "ab-1":
            raise LookupError(f"no run {run_id!r}")
        return {
            "run": "ab-1",
            "rule": "p",
            "status": "done",
            "verdict": "no slowdown shown",
            "margin": 0.02,
            "blocks": [{"block": 1, "off": 10.0, "on": 9.9}, {"block": 2, "off": 10.1, "on": 10.0}],
            "analysis": {"r": 0.99, "low": 0.985, "high": 0.995},
        }

    def metrics(self) -> dict[str, Any]:
        return {"status": self.status(), "duty": {"rules": [], "jobs": []}}

    def ab_plot(self, run_id: str) -> bytes:
        from arbiter.harness.report import plot_png

        return plot_png(self.ab_show(run_id))


def test_paired_runs_their_reports_and_plots() -> None:
    client = TestClient(create_app(FakeProvider()), base_url="http://127.0.0.1:7807")
    assert client.get("/v1/ab").json()[0]["run"] == "ab-1"
    assert client.get("/v1/ab/ab-1").json()["verdict"] == "no slowdown shown"
    assert client.get("/v1/ab/nope").status_code == 404
    plot = client.get("/v1/ab/ab-1/plot")
    assert plot.headers["content-type"] == "image/png" and plot.content[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.get("/v1/ab/nope/plot").status_code == 404


def test_read_endpoints() -> None:
    client = TestClient(create_app(FakeProvider()), base_url="http://127.0.0.1:7807")
    assert client.get("/healthz").text == "ok"
    assert client.get("/v1/status").json()["jobs"][0]["id"] == "j1"
    assert client.get("/v1/explain", params={"subject": "j1"}).json()["subject"] == "j1"
    assert client.get("/v1/explain", params={"subject": "nope"}).status_code == 404
    assert client.get("/v1/timeline", params={"limit": 3, "code": "JOB_PAUSED"}).json() == [
        {"limit": 3, "subject": None, "code": "JOB_PAUSED"}
    ]
    page = client.get("/").text
    assert "PROTECTED_GPU_BUSY" in page and "m &lt;b&gt;" in page
    assert "/v1/status" in client.get("/openapi.json").json()["paths"]


def test_mutation_needs_token_and_loopback_host() -> None:
    provider = FakeProvider()
    client = TestClient(create_app(provider), base_url="http://127.0.0.1:7807")
    assert client.post("/v1/reload").status_code == 401
    assert client.post("/v1/reload", headers={"Authorization": "Bearer wrong"}).status_code == 401
    evil = client.post("/v1/reload", headers={"Authorization": "Bearer s3cret", "Host": "evil.example:7807"})
    assert evil.status_code == 403
    assert client.get("/v1/reload").status_code == 405
    assert client.post("/v1/reload", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert provider.reloads == 1


def test_loopback_hosts() -> None:
    assert is_loopback_host("127.0.0.1:7807") and is_loopback_host("localhost") and is_loopback_host("[::1]:80")
    assert (
        not is_loopback_host("10.0.0.5:7807") and not is_loopback_host("arbiter.local") and not is_loopback_host(None)
    )


def test_a_loopback_listener_refuses_other_host_names_dns_rebinding() -> None:
    """A page at attacker.example whose name now resolves to 127.0.0.1 must not read status."""
    client = TestClient(create_app(FakeProvider()), base_url="http://attacker.example:7807")
    for path in ("/", "/v1/status", "/metrics", "/openapi.json", "/healthz"):
        reply = client.get(path)
        assert reply.status_code == 403, path
        assert "loopback" in reply.json()["detail"]
    assert TestClient(create_app(FakeProvider()), base_url="http://localhost:7807").get("/v1/status").status_code == 200
    assert TestClient(create_app(FakeProvider()), base_url="http://[::1]:7807").get("/healthz").status_code == 200


def test_nothing_served_needs_the_internet() -> None:
    """FastAPI's interactive docs load from a CDN (blank offline): /docs is a plain page of the
    API of our own instead, and neither it nor the status page loads anything from elsewhere."""
    client = TestClient(create_app(FakeProvider()), base_url="http://127.0.0.1:7807")
    assert client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").json()["info"]["title"] == "arbiter"
    docs = client.get("/docs")
    assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
    assert "GET /v1/explain" in docs.text and "POST /v1/reload" in docs.text and "/openapi.json" in docs.text
    page = client.get("/").text
    assert "href='/docs'" in page and "/openapi.json" in page
    for text in (page, docs.text):
        assert "<script" not in docs.text
        for fetch in ("src='http", 'src="http', "href='http", 'href="http', "url(http", "@import"):
            assert fetch not in text  # nothing loaded from elsewhere
