"""The status page's "GPU share over time": each tenant's measured share and the fleet jobs'
total, drawn as inline SVG from the status answer's ``gpu_share_history`` (columns ``t``,
``tenants``, ``jobs``), with a text line that says the same for a reader without images."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arbiter.http.chart import PALETTE, Frame, clock, esc

JOBS_COLOR = "#57606a"


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
    t0, t1 = max(now - window, ts[0]), max(now, ts[-1])
    frame = Frame(t0, max(t1 - t0, 1.0), height=200)
    x, y = frame.x, frame.y
    parts = [
        frame.open("share-chart", "GPU share per tenant and of the jobs over time"),
        *frame.grid((0.0, 0.5, 1.0), lambda v: f"{100 * v:.0f}%"),
        frame.time_label(t0, clock(t0), "start"),
        frame.time_label(t1, clock(t1), "end"),
    ]
    legend, said = [], []
    for name, vs, color, dash in series:
        for run in _runs(ts, vs):
            pts = " ".join(f"{x(t)},{y(v)}" for t, v in run)
            if len(run) == 1:
                ((t, v),) = run
                parts.append(
                    f"<circle class='share-point' data-tenant='{esc(name)}' cx='{x(t)}' cy='{y(v)}' r='2' fill='{color}'/>"
                )
                continue
            dashed = f" stroke-dasharray='{dash}'" if dash else ""
            parts.append(
                f"<polyline class='share-line' data-tenant='{esc(name)}' points='{pts}' fill='none' stroke='{color}' "
                f"stroke-width='1.5'{dashed}><title>{esc(name)}</title></polyline>"
            )
        readable = [v for v in vs if isinstance(v, (int, float))]
        last = vs[-1] if vs else None
        peak = f", peak {_pct(max(readable))}" if readable else ""
        legend.append(f"<span style='color:{color}'>{'┅' if dash else '■'}</span> {esc(name)}")
        said.append(f"{esc(name)} {esc(_pct(last))} now{esc(peak)}")
    parts.append("</svg>")
    caption = (
        f"GPU share per tenant and of the jobs (dashed), one point per tick from {esc(clock(ts[0]))} to "
        f"{esc(clock(ts[-1]))} ({len(ts)} points): " + "; ".join(said)
    )
    return (
        f"<figure class='shares' data-points='{len(ts)}'>{''.join(parts)}"
        f"<figcaption>{caption}<div class='muted'>{' &nbsp; '.join(legend)}</div></figcaption></figure>"
    )
