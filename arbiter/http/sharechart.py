"""The status page's "GPU share over time": each tenant's measured share and the fleet jobs'
total, drawn as inline SVG from the status answer's ``gpu_share_history`` (columns ``t``,
``tenants``, ``jobs``), with a text line that says the same for a reader without images."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4")
JOBS_COLOR = "#57606a"


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _pct(v: float | None) -> str:
    return "unread" if v is None else f"{100 * v:.0f}%"


def _runs(ts: Sequence[float], vs: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    """The stretches of readable values: an unreadable point breaks the line, never drawn as 0."""
    runs: list[list[tuple[float, float]]] = [[]]
    for t, v in zip(ts, vs, strict=False):
        if isinstance(v, (int, float)):
            runs[-1].append((float(t), float(v)))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def share_section(history: Mapping[str, Any] | None, now: float) -> str:
    history = history or {}
    ts = [float(t) for t in history.get("t") or [] if isinstance(t, (int, float))]
    tenants: Mapping[str, Sequence[float | None]] = history.get("tenants") or {}
    jobs: Sequence[float | None] = history.get("jobs") or []
    window = float(history.get("window_s") or 600.0)
    if not ts:
        return (
            "<figure class='shares' data-points='0'><figcaption class='muted'>GPU share per tenant and of the "
            "jobs over the last minutes: no data yet (a point is added on every tick once the daemon has "
            "observed)</figcaption></figure>"
        )
    series = [
        (str(rid), list(vs), PALETTE[i % len(PALETTE)], "") for i, (rid, vs) in enumerate(sorted(tenants.items()))
    ]
    series.append(("jobs", list(jobs), JOBS_COLOR, "6 3"))
    width, height, left, right, top, bottom = 720, 200, 44, 16, 12, 28
    pw, ph = width - left - right, height - top - bottom
    t0, t1 = max(now - window, ts[0]), max(now, ts[-1])
    span = max(t1 - t0, 1.0)

    def x(t: float) -> float:
        return round(left + pw * (max(t, t0) - t0) / span, 1)

    def y(v: float) -> float:
        return round(top + ph * (1 - min(max(v, 0.0), 1.0)), 1)

    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='share-chart' viewBox='0 0 {width} {height}' width='{width}' "
        f"height='{height}' role='img' aria-label='GPU share per tenant and of the jobs over time'>"
    ]
    for v in (0.0, 0.5, 1.0):
        parts.append(
            f"<line x1='{left}' x2='{width - right}' y1='{y(v)}' y2='{y(v)}' stroke='#eaeef2'/>"
            f"<text x='{left - 6}' y='{y(v) + 4}' text-anchor='end' font-size='11' fill='#656d76'>{100 * v:.0f}%</text>"
        )
    for t, anchor in ((t0, "start"), (t1, "end")):
        parts.append(
            f"<text x='{x(t)}' y='{height - 8}' text-anchor='{anchor}' font-size='11' fill='#656d76'>"
            f"{_e(_clock(t))}</text>"
        )
    legend, said = [], []
    for name, vs, color, dash in series:
        for run in _runs(ts, vs):
            pts = " ".join(f"{x(t)},{y(v)}" for t, v in run)
            if len(run) == 1:
                ((t, v),) = run
                parts.append(
                    f"<circle class='share-point' data-tenant='{_e(name)}' cx='{x(t)}' cy='{y(v)}' r='2' fill='{color}'/>"
                )
                continue
            dashed = f" stroke-dasharray='{dash}'" if dash else ""
            parts.append(
                f"<polyline class='share-line' data-tenant='{_e(name)}' points='{pts}' fill='none' stroke='{color}' "
                f"stroke-width='1.5'{dashed}><title>{_e(name)}</title></polyline>"
            )
        readable = [v for v in vs if isinstance(v, (int, float))]
        last = vs[-1] if vs else None
        peak = f", peak {_pct(max(readable))}" if readable else ""
        legend.append(f"<span style='color:{color}'>{'┅' if dash else '■'}</span> {_e(name)}")
        said.append(f"{_e(name)} {_e(_pct(last))} now{_e(peak)}")
    parts.append("</svg>")
    caption = (
        f"GPU share per tenant and of the jobs (dashed), one point per tick from {_e(_clock(ts[0]))} to "
        f"{_e(_clock(ts[-1]))} ({len(ts)} points): " + "; ".join(said)
    )
    return (
        f"<figure class='shares' data-points='{len(ts)}'>{''.join(parts)}"
        f"<figcaption>{caption}<div class='muted'>{' &nbsp; '.join(legend)}</div></figcaption></figure>"
    )
