"""``/docs``: the API's endpoints as one plain page made from the OpenAPI schema, with no
script and nothing loaded from elsewhere (FastAPI's own pages load theirs from a CDN and
render blank on a node without internet)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arbiter.http.chart import esc


def _params(op: Mapping[str, Any]) -> str:
    out = []
    for p in op.get("parameters") or []:
        schema = p.get("schema") or {}
        kind = schema.get("type") or " | ".join(str(s.get("type")) for s in schema.get("anyOf") or [] if s.get("type"))
        bits = [f"<code>{esc(p.get('name'))}</code> ({esc(p.get('in'))}, {esc(kind or 'any')})"]
        if p.get("required"):
            bits.append("required")
        if "default" in schema:
            bits.append(f"default {esc(schema['default'])}")
        if p.get("description"):
            bits.append(esc(p["description"]))
        out.append(", ".join(bits))
    return "<br>".join(out) or "-"


def api_page(schema: Mapping[str, Any]) -> str:
    info = schema.get("info") or {}
    rows = []
    for path, methods in sorted((schema.get("paths") or {}).items()):
        for method, op in methods.items():
            needs = "the token" if method.lower() != "get" else "-"
            rows.append(
                f"<tr><td><code>{esc(method.upper())} {esc(path)}</code></td>"
                f"<td>{esc(op.get('summary') or '')}</td><td>{_params(op)}</td><td>{esc(needs)}</td></tr>"
            )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(info.get('title'))} API</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{border-bottom:1px solid #ccc;padding:.3em .6em;"
        "text-align:left;vertical-align:top}table{border-collapse:collapse}</style></head><body>"
        f"<h1>{esc(info.get('title'))} {esc(info.get('version'))} API</h1><p>{esc(info.get('description'))}</p>"
        "<p>The machine-readable schema: <a href='/openapi.json'>/openapi.json</a>. The status page: "
        "<a href='/'>/</a>.</p><table><tr><th>endpoint</th><th>what</th><th>parameters</th><th>needs</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )
