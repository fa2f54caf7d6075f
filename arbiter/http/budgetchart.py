"""The status page's budget chart: each rule's budget after each governor step, drawn from
the governor's timeline events (each carries the rule, its budget and its ceiling after the
step, so the store already holds the history), as an inline SVG step chart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.http.chart import MUTED, PALETTE, Frame, clock, esc

BUDGET_WINDOW_S = 1800.0


@dataclass(frozen=True)
class BudgetPoint:
    t: float
    budget: float
    ceiling: float | None
    code: str


def budget_history(events: Iterable[Mapping[str, Any]]) -> dict[str, list[BudgetPoint]]:
    """Each rule's budget after each governor step, oldest first; events whose data carries
    no budget are not points."""
    series: dict[str, list[BudgetPoint]] = {}
    for e in events:
        data = e.get("data") or {}
        t, budget = e.get("t"), data.get("budget")
        if not isinstance(t, (int, float)) or not isinstance(budget, (int, float)):
            continue
        rule = str(data.get("rule") or e.get("subject") or "")
        ceiling = data.get("ceiling")
        series.setdefault(rule, []).append(
            BudgetPoint(
                float(t),
                float(budget),
                float(ceiling) if isinstance(ceiling, (int, float)) else None,
                str(e.get("code", "")),
            )
        )
    for points in series.values():
        points.sort(key=lambda p: p.t)
    return series


def budget_chart(
    series: Mapping[str, Sequence[BudgetPoint]],
    current: Mapping[str, float],
    now: float,
    window_s: float = BUDGET_WINDOW_S,
) -> str:
    """An inline SVG step chart of each rule's budget (solid) and ceiling (dashed) over the
    last ``window_s`` up to ``now``; ``current`` is each rule's budget now, which carries the
    line to the right edge."""
    starts = [p.t for points in series.values() for p in points]
    t0 = max(now - window_s, min(starts)) if starts else now - window_s
    frame = Frame(t0, max(now - t0, 1.0))
    x, y = frame.x, frame.y
    parts = [frame.open("budget", "budget over time"), *frame.grid((0.0, 0.25, 0.5, 0.75, 1.0), lambda v: f"{v:g}")]
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        t = t0 + frame.span * frac
        parts.append(frame.time_label(t, "now" if frac == 1.0 else clock(t), anchor))
    legend = []
    for i, (rule, points) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        shown = [p for p in points if p.t >= t0]
        before = [p for p in points if p.t < t0]
        if before:  # the value the window starts at
            shown.insert(0, BudgetPoint(t0, before[-1].budget, before[-1].ceiling, before[-1].code))
        if not shown:
            continue
        end = current.get(rule, shown[-1].budget)
        steps: list[str] = []
        ceil_steps: list[str] = []
        for k, p in enumerate(shown):
            if k:
                prev = shown[k - 1]
                steps.append(f"{x(p.t)},{y(prev.budget)}")
                if prev.ceiling is not None:
                    ceil_steps.append(f"{x(p.t)},{y(prev.ceiling)}")
            steps.append(f"{x(p.t)},{y(p.budget)}")
            if p.ceiling is not None:
                ceil_steps.append(f"{x(p.t)},{y(p.ceiling)}")
        steps += [f"{x(now)},{y(shown[-1].budget)}", f"{x(now)},{y(end)}"]
        if shown[-1].ceiling is not None:
            ceil_steps.append(f"{x(now)},{y(shown[-1].ceiling)}")
        if len(ceil_steps) > 1:
            parts.append(
                f"<polyline class='ceiling' data-rule='{esc(rule)}' points='{' '.join(ceil_steps)}' fill='none' "
                f"stroke='{color}' stroke-width='1' stroke-dasharray='4 3' opacity='0.6'/>"
            )
        parts.append(
            f"<polyline class='budget-line' data-rule='{esc(rule)}' points='{' '.join(steps)}' fill='none' "
            f"stroke='{color}' stroke-width='2'/>"
        )
        for p in shown:
            parts.append(
                f"<circle class='budget-point' data-rule='{esc(rule)}' data-budget='{p.budget:g}' cx='{x(p.t)}' "
                f"cy='{y(p.budget)}' r='3' fill='{color}'><title>{esc(rule)} {esc(p.code)}: budget {p.budget:.2f}"
                f" at {clock(p.t)}</title></circle>"
            )
        legend.append(f"<span style='color:{color}'>■</span> {esc(rule)} (now {end:.2f})")
    if not legend:
        parts.append(
            f"<text x='{frame.left + frame.plot_w / 2}' y='{frame.top + frame.plot_h / 2}' text-anchor='middle' "
            f"font-size='13' fill='{MUTED}'>"
            "no governor step in this window</text>"
        )
    parts.append("</svg>")
    key = " &nbsp; ".join(legend) + (
        " &nbsp; <span class='muted'>dashed: the certificate ceiling</span>" if legend else ""
    )
    return "".join(parts) + f"<div class='muted'>{key}</div>"
