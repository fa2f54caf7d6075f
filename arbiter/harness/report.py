"""The report of a paired ON/OFF run: its blocks, the blocks left out and why, R with its
intervals against the margin, the checks on the design, as JSON, text and a picture."""

from __future__ import annotations

import io
import math
from typing import Any

from arbiter.engine.abrun import from_record, summary


def report(rec: dict[str, Any], live: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything ``arbiter ab show`` prints, from a run's record."""
    rs = from_record(rec)
    spec = rs.spec
    s = summary(rs)
    return {
        "run": spec.run_id,
        "sweep": spec.sweep_id,
        "rule": spec.rule_id,
        "work": spec.work,
        "duty": spec.duty,
        "off": spec.off,
        "margin": spec.margin,
        "window_s": spec.window_s,
        "washout_s": spec.washout_s,
        "max_hours": spec.max_hours,
        "status": rs.status,
        "verdict": rs.verdict,
        "why": rs.why,
        "certifies": rs.certifies,
        "target": rs.target,
        "started": rs.started_wall,
        "ended": rs.ended_wall,
        "passed_before": list(rs.passed),
        "blocks": [
            {
                "block": b.attempt + 1,
                "off": b.off,
                "on": b.on,
                "d": math.log(b.on / b.off) if b.on > 0 else None,
                "order": "on-off" if b.on_first else "off-on",
                "on_events": b.on_events,
                "off_events": b.off_events,
                "work_duty": b.work_duty,
            }
            for b in rs.blocks
        ],
        "excluded": [{"block": e.attempt + 1, "arm": e.arm, "why": e.why, "at": e.at} for e in rs.excluded],
        "excluded_mostly_on": s.mostly_on,
        "analysis": s.analysis,
        "notes": list(s.notes),
        "live": live,
    }


def text(rep: dict[str, Any]) -> str:
    """The report in one screen."""
    duty = "as it runs" if rep["duty"] is None else f"duty {rep['duty']:g}"
    lines = [
        f"run {rep['run']}: {rep['work']} work ({duty}, off = {rep['off']}) beside {rep['rule']!r}, "
        f"margin {100 * rep['margin']:g} %",
        f"status {rep['status']}"
        + (f": {rep['verdict']}" if rep["verdict"] else "")
        + (f" ({rep['why']})" if rep["why"] else ""),
    ]
    live = rep.get("live") or {}
    window = live.get("window")
    lines.append(
        f"blocks {len(rep['blocks'])} of {rep['target']}, {len(rep['excluded'])} left out"
        + (
            f"; now block {window['block']} {window['arm'].upper()}, {window['ends_in_s']:.0f}s left in the window"
            if window
            else ""
        )
    )
    a = rep.get("analysis")
    if a:
        fieller = a.get("fieller")
        lines.append(
            f"R = {a['r']:.4f}, {a.get('confidence', 0.9) * 100:g} % interval {a['low']:.4f}–{a['high']:.4f} (1 − margin = {1 - rep['margin']:.4f})"
            + (f"; Fieller {fieller[0]:.4f}–{fieller[1]:.4f}" if fieller else "; Fieller unbounded")
        )
        if a.get("method_why"):
            lines.append(
                f"{a['method_why']}; paired t-interval {a['t_low']:.4f}–{a['t_high']:.4f}"
                + (
                    f"; the first {a['pilot']} blocks (the pilot) sized the run and are not in R"
                    if a.get("pilot")
                    else ""
                )
            )
        ends = a.get("ends")
        if ends:
            lines.append(
                f"the effect over the first {a['end_blocks']} blocks: R = {ends[0][0]:.4f} (lower bound {ends[0][1]:.4f}),"
                f" over the last {a['end_blocks']}: R = {ends[1][0]:.4f} ({ends[1][1]:.4f}); a certificate needs both"
                " lower bounds at or above 1 − margin too"
            )
        extra = []
        if a.get("lag1") is not None:
            extra.append(f"lag-1 autocorrelation {a['lag1']:+.2f}")
        if a.get("order_effect") is not None:
            extra.append(f"order effect {a['order_effect']:+.4f}" + (" (flagged)" if a["order_effect_flag"] else ""))
        if a.get("more_blocks"):
            extra.append(f"about {a['more_blocks']} more block(s) would decide it")
        if extra:
            lines.append("; ".join(extra))
    if rep["blocks"]:
        lines.append("block  order    off/s     on/s        d   work duty")
        for b in rep["blocks"]:
            d = "-" if b["d"] is None else f"{b['d']:+.4f}"
            wd = "-" if b["work_duty"] is None else f"{b['work_duty']:.2f}"
            lines.append(f"{b['block']:>5}  {b['order']:<6} {b['off']:>8.3f} {b['on']:>8.3f} {d:>8} {wd:>11}")
    for e in rep["excluded"]:
        lines.append(f"left out: block {e['block']} ({e['arm']}): {e['why']}")
    lines.extend(f"note: {n}" for n in rep["notes"])
    if rep["certifies"]:
        lines.append("earned a certificate (`arbiter certificates`)")
    return "\n".join(lines)


def plot_png(rep: dict[str, Any]) -> bytes:
    """Each block's OFF and ON rate side by side, and R with its interval against the margin."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4), dpi=100)
    rates, ratio = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
    blocks = rep["blocks"]
    xs = list(range(len(blocks)))
    rates.bar([x - 0.2 for x in xs], [b["off"] for b in blocks], width=0.4, label="OFF (work held)", color="#7a8ca3")
    rates.bar([x + 0.2 for x in xs], [b["on"] for b in blocks], width=0.4, label="ON (work runs)", color="#d98c3f")
    rates.set_xticks(xs, [str(b["block"]) for b in blocks])
    rates.set_xlabel("block")
    rates.set_ylabel(f"{rep['rule']} progress (events/s)")
    rates.set_title(
        f"run {rep['run']}: {rep['status']}" + (f", {rep['verdict']}" if rep["verdict"] else ""), fontsize=10
    )
    rates.legend(loc="lower right", fontsize=8)
    floor = 1 - rep["margin"]
    ratio.axhline(1.0, color="#444", linewidth=0.8)
    ratio.axhline(floor, color="#c0392b", linestyle="--", linewidth=1, label=f"1 − margin ({floor:.3f})")
    a = rep.get("analysis")
    if a:
        ratio.errorbar(
            [0],
            [a["r"]],
            yerr=[[a["r"] - a["low"]], [a["high"] - a["r"]]],
            fmt="o",
            color="#1f4e79",
            capsize=6,
            label=f"R, {a.get('confidence', 0.9) * 100:g} % interval",
        )
        low = min(a["low"], floor)
        high = max(a["high"], 1.0)
        pad = (high - low) * 0.2 or 0.01
        ratio.set_ylim(low - pad, high + pad)
    ratio.set_xticks([])
    ratio.set_title("R = ON / OFF", fontsize=10)
    ratio.legend(loc="lower center", fontsize=7)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def main() -> None:
    """``python -m arbiter.harness.report`` reads a report (JSON) on stdin and writes its PNG
    to stdout: the daemon draws in a process of its own, so plotting never holds its threads."""
    import json
    import sys

    sys.stdout.buffer.write(plot_png(json.load(sys.stdin)))


if __name__ == "__main__":
    main()
