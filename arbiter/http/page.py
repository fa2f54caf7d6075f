"""The status page at ``/``: server-rendered HTML from the provider's answers, no script and
no external asset, so it works from a plain ``curl`` as well as a browser, and refreshes
itself.

Jobs, tenants and their sources come from the status answer, whose items are the explain answer for the
node (same builder), so each reason shows with its code, message and remedy.  The budget
chart (``budgetchart.py``) is drawn from the governor's timeline events.  The GPU share over time
(``sharechart.py``) is drawn from the status answer's ``gpu_share_history``.  ``?subject=ID`` keeps
the timeline to one job's or tenant's entries: its history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from arbiter.engine import codes
from arbiter.http.budgetchart import budget_chart, budget_history
from arbiter.http.chart import clock, esc
from arbiter.http.sharechart import share_section

if TYPE_CHECKING:
    from arbiter.http.provider import Provider

REFRESH_S = 3
TIMELINE_ROWS = 25
AB_RECENT = 5
BUDGET_EVENTS_PER_CODE = 200
# the steps of a rule's governor; each event's data says the budget and ceiling after it
GOVERNOR_CODES = (
    codes.GPU_DUTY_START,
    codes.GPU_DUTY_BASELINE,
    codes.GPU_DUTY_GROW,
    codes.GPU_DUTY_HALVE,
    codes.GPU_DUTY_TAKE_BACK,
    codes.GPU_DUTY_CLAMP,
)
STATE_CLASS = {"run": "ok", "held": "warn", "paused": "warn", "stopping": "bad"}

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#1f2328;background:#fff}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;width:100%}th,td{text-align:left;vertical-align:top;padding:.3em .6em;border-bottom:1px solid #eaeef2}
th{background:#f6f8fa;font-weight:600}.muted{color:#656d76}.code{font-family:ui-monospace,monospace;font-weight:700}
.ok{color:#1a7f37;font-weight:600}.warn{color:#9a6700;font-weight:600}.bad{color:#d1242f;font-weight:600}
.remedy{color:#0a7ea4}.reason{margin:.1em 0 .4em}.notice{background:#fff8c5;border:1px solid #d4a72c;padding:.4em .6em;margin:.3em 0}
.facts span{margin-right:1.4em}figure{margin:.4em 0}svg{max-width:100%;height:auto;border:1px solid #eaeef2}
.ab{display:inline-block;margin:.5em 1em .5em 0;vertical-align:top}.ab img{max-width:480px;border:1px solid #eaeef2}
"""


def _gb(n: int | None) -> str:
    return "unknown" if n is None else f"{n / (1 << 30):.1f} GB"


def _reasons(reasons: Iterable[Mapping[str, Any]]) -> str:
    out = []
    for r in reasons:
        remedy = f"<div class='remedy'>→ {esc(r['remedy'])}</div>" if r.get("remedy") else ""
        out.append(
            f"<div class='reason'><span class='code'>{esc(r.get('code'))}</span> {esc(r.get('message'))}{remedy}</div>"
        )
    return "".join(out) or "<span class='muted'>-</span>"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], empty: str, cls: str = "") -> str:
    """Cells are HTML already (escaped where they hold data)."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not rows:
        body = f"<tr><td colspan='{len(head)}' class='muted'>{esc(empty)}</td></tr>"
    return f"<table class='{cls}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# --- the node ---------------------------------------------------------------------------------


def node_section(s: Mapping[str, Any]) -> str:
    reader = s.get("reader") or {}
    facts = [
        f"version <b>{esc(s.get('version'))}</b>",
        f"gpu_jobs <b>{esc(s.get('gpu_jobs'))}</b>",
    ]
    if s.get("uptime_s") is not None:
        facts.append(f"up {float(s['uptime_s']):.0f}s")
    if s.get("tick_s") is not None:
        facts.append(f"tick {float(s['tick_s']):g}s")
    if reader:
        why = f" <span class='muted'>({esc(reader['why'])})</span>" if reader.get("why") else ""
        facts.append(f"reader <b>{esc(reader.get('name') or 'none')}</b>{why}")
    if s.get("processes") is not None:
        facts.append(f"{esc(s['processes'])} processes, scan {esc(s.get('scan_ms'))} ms")
    lines = ["<p class='facts'>" + "".join(f"<span>{f}</span>" for f in facts) + "</p>"]
    vram = s.get("vram") or {}
    if vram.get("total_bytes") is not None:
        lines.append(
            f"<p>VRAM: {_gb(vram.get('free_bytes'))} free of {_gb(vram['total_bytes'])}; jobs "
            f"{_gb(vram.get('jobs_bytes'))}; unmanaged (no rule claims it) {_gb(vram.get('unmanaged_bytes'))}</p>"
        )
    else:
        lines.append("<p class='muted'>VRAM: not read on this node</p>")
    for told in s.get("scheduler_labels") or []:  # what a fleet scheduler is told of this node
        labels = ", ".join(f"<span class='code'>{esc(label)}</span>" for label in told["labels"]) or "none"
        failed = f" <span class='notice'>{esc(told['error'])}</span>" if told.get("error") else ""
        lines.append(f"<p>{esc(told['scheduler'])} node {esc(told['node'])}: features {labels}{failed}</p>")
    fp = s.get("fast_path") or {}
    if fp.get("count"):
        lines.append(
            f"<p>fast path: {esc(fp['count'])} phase changes, p50 {esc(fp.get('p50_ms'))} ms, "
            f"p99 {esc(fp.get('p99_ms'))} ms</p>"
        )
    for notice in s.get("notices") or []:
        lines.append(f"<div class='notice'>{_reasons([notice])}</div>")
    for file, problems in (s.get("problems") or {}).items():
        lines.append(f"<div class='notice'><b>{esc(file)}</b>: {esc(problems[0] if problems else '')}</div>")
    recorder = s.get("recorder") or {}
    if recorder.get("failures"):
        lines.append(
            f"<div class='notice'>recording failed {esc(recorder['failures'])}x: {esc(recorder.get('last_error'))}</div>"
        )
    return "".join(lines)


# --- jobs and tenants -------------------------------------------------------------------------


def jobs_section(jobs: Sequence[Mapping[str, Any]], duty_jobs: Sequence[Mapping[str, Any]]) -> str:
    duty_of = {j.get("id"): j for j in duty_jobs}
    rows = []
    for j in jobs:
        state = str(j.get("state", ""))
        via = f" ({esc(j['via'])})" if j.get("via") else ""
        d = duty_of.get(j.get("id"), {})
        measured = d.get("measured", j.get("measured_busy"))
        duty = f"{float(j.get('duty') or 0):.2f}" + (
            "" if measured is None else f" <span class='muted'>measured {float(measured):.2f}</span>"
        )
        if d.get("state"):
            duty += f"<br><span class='muted'>{esc(d['state'])}</span>"
        name = (
            f"<br><span class='muted'>{esc(j['name'])}</span>" if j.get("name") and j.get("name") != j.get("id") else ""
        )
        pids = [str(p) for p in j.get("pids") or []]
        rows.append(
            [
                f"{_history_link(j.get('id'))}{name}",
                f"<span class='state {STATE_CLASS.get(state, '')}'>{esc(state)}</span>{via}",
                duty,
                esc(j.get("use", "")),
                esc(" ".join(pids[:6]) + (" …" if len(pids) > 6 else "")),
                _reasons(j.get("reasons") or []),
            ]
        )
    return _table(
        ("job", "state", "duty", "gpu", "pids", "why"),
        rows,
        "no jobs are registered; start one with `arbiter job run -- CMD`",
        cls="jobs",
    )


def _history_link(subject: Any) -> str:
    """A job's or tenant's id, linking to the page with only its timeline entries."""
    href = f"/?subject={quote(str(subject), safe='')}#timeline"
    return f"<a class='code' href='{esc(href)}'>{esc(subject)}</a>"


def sources_section(rules: Sequence[Mapping[str, Any]]) -> str:
    """Each tenant's sources: whether they read, their rate, who reads them, how fast a write
    reaches a decision."""
    rows = []
    for r in rules:
        for src in r.get("sources") or []:
            if src.get("readable", True):
                state = f"<span class='state run'>{esc(src.get('says') or 'reads')}</span>"
            else:
                why = "needs a session helper: " if src.get("needs_helper") else "cannot be read: "
                state = f"<span class='bad'>{esc(why + str(src.get('why', '')))}</span>"
            lat = src.get("latency") or {}
            rows.append(
                [
                    _history_link(r.get("id")),
                    esc(f"{src.get('slot', '')} ({src.get('kind', '')})"),
                    state,
                    esc("-" if src.get("rate") is None else f"{float(src['rate']):.3g}"),
                    esc(src.get("read_by", "")),
                    esc(
                        f"{lat.get('p50_ms')} / {lat.get('p99_ms')} ms ({lat.get('count')})"
                        if lat.get("count")
                        else "-"
                    ),
                ]
            )
    return _table(
        ("tenant", "source", "state", "rate/s", "read by", "write → decision p50/p99"),
        rows,
        "no tenant reads a source (rules with protect.source, during:, busy: or events: do)",
        cls="sources",
    )


def _share(r: Mapping[str, Any]) -> str:
    if not r.get("running"):
        return "-"
    share = "unreadable" if r.get("gpu_share") is None else f"{100 * float(r['gpu_share']):.0f}%"
    return esc(share) + (f" <span class='muted'>({esc(r['gpu_why'])})</span>" if r.get("gpu_why") else "")


def _vram(r: Mapping[str, Any]) -> str:
    if not r.get("running"):
        return "-"
    text = _gb(r.get("vram_bytes")) + ("" if r.get("reclaimable") else " (kept)")
    releasing = r.get("releasing")
    if releasing:
        text += f", releasing {float(releasing['for_s']):.1f}s"
    return esc(text)


def tenants_section(rules: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for r in rules:
        running = f"yes ({len(r.get('pids') or [])})" if r.get("running") else "no"
        using = "no"
        if r.get("using_gpu"):
            using = "yes" + (f" {float(r['using_for_s']):.0f}s" if r.get("using_for_s") else "")
        extra = "".join(f"<div class='bad'>fault: {esc(f)}</div>" for f in r.get("faults") or [])
        for src in r.get("sources") or []:
            if not src.get("readable", True):
                what = "needs a session helper" if src.get("needs_helper") else "cannot be read"
                extra += f"<div class='bad'>source {esc(src.get('slot'))} ({esc(src.get('kind'))}) {what}: {esc(src.get('why'))}</div>"
        holds = [*(r.get("holds") or []), *(r.get("notes") or [])]
        rows.append(
            [
                _history_link(r.get("id")),
                esc(r.get("priority", "")),
                "yes" if r.get("protected") else "no",
                esc(running),
                _share(r),
                esc(using),
                _vram(r),
                esc(", ".join(r.get("phases") or []) or "-"),
                (_reasons(holds) if holds else "<span class='muted'>-</span>") + extra,
            ]
        )
    return _table(
        ("tenant", "prio", "protected", "running", "GPU", "uses GPU", "VRAM", "phases", "holds"),
        rows,
        "no tenant rules are loaded",
        cls="tenants",
    )


# --- the budget over time ---------------------------------------------------------------------


def budget_section(
    duty: Mapping[str, Any], events: Iterable[Mapping[str, Any]], now: float, gpu_jobs: str = "certified"
) -> str:
    rules = duty.get("rules") or []
    current = {str(r["rule"]): float(r["budget"]) for r in rules if isinstance(r.get("budget"), (int, float))}
    history = budget_history(events)
    out = [f"<p><b>{esc(duty.get('summary', ''))}</b></p>"]
    if gpu_jobs != "certified" and not history and not current:
        # nothing to draw: say why, rather than show an empty chart
        out.append(
            f"<p class='muted'>This node runs gpu_jobs: {esc(gpu_jobs)}: GPU work waits while a protected program "
            "uses the GPU, so no budget is given out beside one. Under gpu_jobs: certified, a budget per protected "
            "program, earned by `arbiter ab sweep`, is drawn here over time.</p>"
        )
        return "".join(out)
    out.append(budget_chart(history, current, now))
    rows = []
    for r in rules:
        left = f" ({float(r['take_back_left_s']):.0f}s left)" if r.get("take_back_left_s") else ""
        rows.append(
            [
                f"<span class='code'>{esc(r.get('rule'))}</span>",
                esc(f"{r.get('state', '')}{left}"),
                esc(f"{float(r.get('budget') or 0):.2f}"),
                esc(f"{float(r.get('ceiling') or 0):.2f}"),
                esc("-" if r.get("baseline") is None else f"{float(r['baseline']):.3g}"),
                esc("-" if r.get("pressure") is None else f"{100 * float(r['pressure']):.1f}%"),
            ]
        )
    if rows:
        out.append(
            _table(("rule", "state", "budget", "ceiling", "baseline/s", "last pressure"), rows, "", cls="governors")
        )
    return "".join(out)


# --- timeline and A/B runs --------------------------------------------------------------------


def timeline_section(events: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for e in sorted(events, key=lambda e: e.get("t") or 0.0, reverse=True)[:TIMELINE_ROWS]:
        t = e.get("t")
        stamp = clock(t) + (f".{int(t * 1000) % 1000:03d}" if isinstance(t, (int, float)) else "")
        rows.append(
            [
                esc(stamp),
                f"<span class='code'>{esc(e.get('code'))}</span>",
                esc(e.get("subject")),
                esc(e.get("message")),
            ]
        )
    return _table(("time", "code", "subject", "message"), rows, "nothing recorded yet", cls="timeline")


def ab_section(runs: Sequence[Mapping[str, Any]]) -> str:
    open_runs = [r for r in runs if r.get("status") == "running"]
    done = sorted(
        (r for r in runs if r.get("status") != "running"), key=lambda r: r.get("started") or 0.0, reverse=True
    )
    shown = [*open_runs, *done[:AB_RECENT]]
    if not shown:
        return "<p class='muted'>no A/B run yet; `arbiter ab run --rule RULE` measures what GPU work costs a tenant</p>"
    out = []
    for r in shown:
        run = str(r.get("run", ""))
        verdict = f": {esc(r['verdict'])}" if r.get("verdict") else ""
        why = f" <span class='muted'>({esc(r['why'])})</span>" if r.get("why") else ""
        blocks = f"blocks {esc(r.get('blocks_done', 0))} of {esc(r.get('target', '?'))}, {esc(r.get('excluded', 0))} left out"
        duty = "as it runs" if r.get("duty") is None else f"duty {esc(r['duty'])}"
        out.append(
            f"<div class='ab' data-run='{esc(run)}'><div><span class='code'>{esc(run)}</span> "
            f"{esc(r.get('work', ''))} work ({duty}) beside {esc(r.get('rule', ''))}</div>"
            f"<div>status <b>{esc(r.get('status', ''))}</b>{verdict}{why}</div><div class='muted'>{blocks}</div>"
            f"<img src='/v1/ab/{esc(quote(run, safe=''))}/plot' alt='{esc(f'plot of {run}')}' loading='lazy'></div>"
        )
    return "".join(out)


# --- the page ---------------------------------------------------------------------------------


def governor_events(provider: Provider) -> list[dict[str, Any]]:
    """The governor's recent steps: asked per code, so other events cannot crowd them out."""
    events: list[dict[str, Any]] = []
    for code in GOVERNOR_CODES:
        events += [e for e in provider.timeline(BUDGET_EVENTS_PER_CODE, None, code) if e.get("code") == code]
    return events


def render_page(provider: Provider, now: float, subject: str | None = None) -> str:
    """The page; with ``subject`` (a job id or a tenant), its timeline holds only that one's
    entries: the job's or tenant's history."""
    status = provider.status()
    duty = provider.duty()
    gpu_jobs = str(status.get("gpu_jobs", ""))
    timeline = timeline_section(provider.timeline(TIMELINE_ROWS, subject or None, None))
    if subject:
        timeline = (
            f"<p>only <span class='code'>{esc(subject)}</span>: <a href='/#timeline'>every entry</a></p>" + timeline
        )
    sections = [
        ("Node", node_section(status)),
        ("Jobs", jobs_section(status.get("jobs") or [], duty.get("jobs") or [])),
        ("Tenants", tenants_section(status.get("rules") or [])),
        ("Sources", sources_section(status.get("rules") or [])),
        ("GPU share over time", share_section(status.get("gpu_share_history"), now)),
        ("Budget over time", budget_section(duty, governor_events(provider), now, gpu_jobs)),
        ("Timeline", timeline),
        ("A/B runs", ab_section(provider.ab_status())),
    ]
    body = "".join(
        f"<section id='{esc(title.split()[0].lower().replace('/', ''))}'><h2>{esc(title)}</h2>{html}</section>"
        for title, html in sections
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{REFRESH_S}'><meta name='viewport' content='width=device-width'>"
        f"<title>arbiter {esc(status.get('version', ''))}</title><style>{CSS}</style></head><body>"
        f"<h1>arbiter</h1><div class='muted'>refreshes every {REFRESH_S}s; as of {clock(now)}; JSON at "
        "<a href='/v1/status'>/v1/status</a>, <a href='/v1/explain'>/v1/explain</a>, <a href='/v1/duty'>/v1/duty</a>, "
        "<a href='/v1/timeline'>/v1/timeline</a>; the API at <a href='/docs'>/docs</a> (schema at <a href='/openapi.json'>/openapi.json</a>)</div>"
        f"{body}</body></html>"
    )
