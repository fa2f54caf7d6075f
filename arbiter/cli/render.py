"""Human output: rich tables for status, explain and the timeline.

Everything shown here is data (rule ids, tags, job names, what jobs report, messages that
quote them), so no string is read as rich markup: a tag ``[/x]`` or a reported phase
``[link=...]`` prints as written.  Styles come from :class:`~rich.text.Text` alone.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from arbiter.api.text import escape_controls

#: the width output to a file or a pipe is laid out for: no line is wrapped short of it (tables
#: are as wide as what they hold, so nothing pads a line to it)
UNWRAPPED = 1000


def console(**options: Any) -> Console:
    """The console every command prints through: no markup in strings (see above).

    On a terminal, its width.  Into a file, a pipe or a CI log, plain text without colours and
    without wrapping: a sentence stays one line and a code is never split across two, so what
    is saved can be searched.  ``COLUMNS`` still sets a width where one is wanted.
    """
    made = Console(markup=False, **options)
    if not made.is_terminal and "width" not in options and not os.environ.get("COLUMNS"):
        made = Console(markup=False, width=UNWRAPPED, soft_wrap=True, **options)
    return made


STATE_STYLE = {"run": "green", "held": "yellow", "paused": "yellow", "stopping": "red"}


def _reasons(reasons: list[dict[str, Any]]) -> Text:
    text = Text()
    for i, r in enumerate(reasons):
        if i:
            text.append("\n")
        text.append(r["code"], style="bold")
        text.append(f" {r['message']}")
        if r.get("remedy"):
            text.append(f"\n  → {r['remedy']}", style="cyan")
    return text


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table(title="Jobs")
    for col in ("job", "state", "duty", "gpu", "pids", "why"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        state = j["state"] + (f" ({j['via']})" if j.get("via") else "")
        table.add_row(
            j["id"],
            Text(state, style=STATE_STYLE.get(j["state"], "")),
            f"{j['duty']:.2f}",
            j["use"],
            " ".join(map(str, j["pids"][:6])) + (" …" if len(j["pids"]) > 6 else ""),
            _reasons(j["reasons"]),
        )
    if not jobs:
        table.add_row("(none)", "", "", "", "", "")
    return table


def rules_table(rules: list[dict[str, Any]]) -> Table:
    table = Table(title="Tenants")
    for col in ("rule", "prio", "protected", "running", "GPU", "uses GPU", "VRAM", "phases", "holds"):
        table.add_column(col, overflow="fold")
    for r in rules:
        share = "unreadable" if r["gpu_share"] is None else f"{100 * r['gpu_share']:.0f}%"
        phases = ", ".join(r["phases"]) or "-"
        using = "yes" + (f" {r['using_for_s']:.0f}s" if r.get("using_for_s") else "") if r["using_gpu"] else "no"
        table.add_row(
            r["id"],
            str(r["priority"]),
            "yes" if r["protected"] else "no",
            f"yes ({len(r['pids'])})" if r["running"] else "no",
            share,
            using,
            _vram(r),
            phases,
            ", ".join(h["code"] for h in [*r["holds"], *r.get("notes", [])]) or "-",
        )
    return table


def _gb(n: int | None) -> str:
    return "unknown" if n is None else f"{n / (1 << 30):.1f} GB"


def _vram(r: dict[str, Any]) -> str:
    if not r["running"]:
        return "-"
    text = _gb(r.get("vram_bytes")) + ("" if r.get("reclaimable") else " (kept)")
    releasing = r.get("releasing")
    if releasing:
        text += f", releasing {releasing['for_s']:.1f}s"
    return text


def sources_table(rules: list[dict[str, Any]]) -> Table:
    table = Table(title="Sources")
    for col in ("rule", "source", "state", "rate/s", "read by", "write → decision p50/p99"):
        table.add_column(col, overflow="fold")
    for r in rules:
        for src in r.get("sources", []):
            if src["readable"]:
                state = Text(src.get("says") or "reads", style="yellow" if src.get("busy") else "green")
            else:
                state = Text(("needs helper: " if src["needs_helper"] else "unreadable: ") + src["why"], style="red")
            lat = src["latency"]
            table.add_row(
                r["id"],
                f"{src['slot']} ({src['kind']})",
                state,
                "-" if src["rate"] is None else f"{src['rate']:.3g}",
                src["read_by"],
                f"{lat['p50_ms']} / {lat['p99_ms']} ms ({lat['count']})" if lat["count"] else "-",
            )
    return table


def status_renderable(s: dict[str, Any]) -> Group:
    head = Text()
    head.append(f"arbiter {s['version']}", style="bold")
    head.append(f"  gpu_jobs: {s['gpu_jobs']}  tick: {s['tick_s']:g}s  up {s['uptime_s']:.0f}s\n")
    reader = s["reader"]
    head.append(f"reader: {reader['name'] or 'none'}" + (f" ({reader['why']})" if reader["why"] else ""))
    head.append(f"  processes: {s['processes']}  scan: {s['scan_ms']} ms")
    fp = s["fast_path"]
    if fp["count"]:
        head.append(f"\nfast path: {fp['count']} phase changes, p50 {fp['p50_ms']} ms, p99 {fp['p99_ms']} ms")
    said: dict[str, list[str]] = {}
    for role, did in (fp.get("threads") or {}).items():
        said.setdefault(did, []).append(role)
    for did, roles in said.items():
        head.append(f"\nfast-path threads ({', '.join(roles)}): {did}")
    process = fp.get("reflex_process")
    if process is None and fp.get("reflex_off"):
        head.append(f"\nreflex process: off ({fp['reflex_off']}); the daemon acts on phase changes itself")
    if process and (process["pid"] or process["failure"]):
        head.append(
            f"\nreflex process: pid {process['pid']}, {process['sources']} phase source(s)"
            if process["pid"]
            else f"\nreflex process: none ({process['failure']}); the daemon acts on phase changes itself"
        )
    vram = s.get("vram") or {}
    if vram.get("total_bytes") is not None:
        head.append(
            f"\nVRAM: {_gb(vram.get('free_bytes'))} free of {_gb(vram['total_bytes'])}; jobs "
            f"{_gb(vram.get('jobs_bytes'))}, unmanaged (no rule claims it) {_gb(vram.get('unmanaged_bytes'))}"
        )
    for told in s.get("scheduler_labels") or []:  # what a fleet scheduler is told of this node
        head.append(f"\n{told['scheduler']} node {told['node']}: features {', '.join(told['labels']) or 'none'}")
        if told.get("error"):
            head.append(f" ({told['error']})", style="red")
    parts: list[Any] = [head, rules_table(s["rules"])]
    if any(r.get("sources") for r in s["rules"]):
        parts.append(sources_table(s["rules"]))
    parts.append(jobs_table(s["jobs"]))
    for notice in s["notices"]:
        parts.append(Text(f"{notice['code']}: {notice['message']} → {notice['remedy']}", style="red"))
    for file, problems in s.get("problems", {}).items():
        parts.append(Text(f"{file}: {problems[0]}", style="red"))
    if s["recorder"]["failures"]:
        parts.append(Text(f"recording failed {s['recorder']['failures']}x: {s['recorder']['last_error']}", style="red"))
    return Group(*parts)


def print_status(console: Console, s: dict[str, Any]) -> None:
    console.print(status_renderable(s))


def print_explain(console: Console, e: dict[str, Any]) -> None:
    items = e["items"]
    jobs = [i for i in items if i["kind"] == "job"]
    rules = [i for i in items if i["kind"] == "rule"]
    for notice in e["notices"]:
        console.print(Text(f"{notice['code']}: {notice['message']}\n  → {notice['remedy']}", style="red"))
    if e["subject"] == "node" and not jobs:
        console.print("No jobs are registered. Start one with `arbiter job run -- CMD`.")
    for j in jobs:
        title = Text(f"{j['id']} ", style="bold")
        verb = {
            "run": "runs",
            "held": "waits (not started)",
            "paused": f"is paused ({j['via']})",
            "stopping": "is stopping",
        }
        title.append(verb.get(j["state"], j["state"]), style=STATE_STYLE.get(j["state"], ""))
        if j["state"] == "run":
            title.append(f" at duty {j['duty']:.2f}")
        console.print(title)
        said = _reported(j.get("reported", {}))
        if said:
            console.print(f"  it reports: {said}")
        for trouble in (j.get("reported", {}).get(k) for k in ("why", "problem")):
            if trouble:
                console.print(Text(f"  its events file: {trouble}", style="yellow"))
        if j.get("pause_effect"):
            console.print(f"  its pause: {j['pause_effect']}")
        held = j.get("protection_pause")
        if held:
            if held["evict_after_s"] is None:
                then = "it waits however long protection needs (evict_after_s: null)"
            else:
                then = f"stopped in {held['evict_in_s']:g}s if still paused (evict_after_s: {held['evict_after_s']:g})"
            console.print(f"  paused by protection for {held['for_s']:g}s; {then}")
            if held.get("evict_basis"):
                console.print(f"  evict_after_s is auto: {held['evict_basis']}")
        if j["reasons"] or j.get("problems"):
            console.print(_reasons(j["reasons"] + j.get("problems", [])))
        elif j["state"] == "run":
            console.print("  nothing holds it")
    for r in rules:
        line = Text(f"tenant {r['id']}", style="bold")
        line.append(f" ({'protected' if r['protected'] else 'not protected'}, priority {r['priority']}): ")
        line.append("running" if r["running"] else "not running")
        if r["running"]:
            share = "unreadable" if r["gpu_share"] is None else f"{100 * r['gpu_share']:.0f}%"
            line.append(f", GPU {share}" + (f" ({r['gpu_why']})" if r["gpu_why"] else ""))
        for src in r.get("sources", []):
            if src["readable"] and src.get("busy") is not None:
                line.append(f", its {src['slot']} probe says {src.get('says') or 'busy'}")
        if r["using_gpu"]:
            line.append(", counts as using the GPU")
        console.print(line)
        if e["subject"].isdigit():
            console.print(f"  owns process {e['subject']}")
        for pid, first in sorted(r.get("from_trees", {}).items()):
            console.print(f"  owns process {pid}, which {first!r} also selects: it runs inside {r['id']!r}'s tree")
        for f in r["faults"]:
            console.print(Text(f"  fault: {f}", style="red"))
        for src in r.get("sources", []):
            if not src["readable"]:
                what = "needs a session helper" if src["needs_helper"] else "cannot be read"
                console.print(Text(f"  source {src['slot']} ({src['kind']}) {what}: {src['why']}", style="red"))
        if e["subject"] != "node" and r["holds"]:
            console.print(_reasons(r["holds"]))
        if r.get("notes"):  # what it waits for itself: VRAM a handoff cannot free, and why
            console.print(_reasons(r["notes"]))
        if r.get("problems"):  # what failed when the daemon asked it (a release)
            console.print(_reasons(r["problems"]))


def _reported(r: dict[str, Any]) -> str:
    """What a job says of itself (its events file), in one line."""
    parts = []
    if "phase" in r:
        parts.append(f"phase {r['phase']['name']}")
    if "progress" in r:
        done, total = r["progress"]["done"], r["progress"]["total"]
        parts.append(f"{done}/{total} done ({100 * done / total:.0f}%)" if total else f"{done} done")
    if "duty" in r:
        d = r["duty"]
        parts.append(f"holds duty {d['duty']:.2f} ({d['device']} busy {d['busy']:.2f} by its own measure)")
    if "stop_acked_at" in r:
        parts.append("acknowledged the stop")
    return ", ".join(parts)


def print_timeline(console: Console, events: list[dict[str, Any]]) -> None:
    table = Table(title="Timeline")
    table.add_column("time", no_wrap=True)
    table.add_column("code", no_wrap=True)  # a code split over two lines cannot be searched for
    for col in ("subject", "message"):
        table.add_column(col, overflow="fold")
    for e in events:
        stamp = time.strftime("%H:%M:%S", time.localtime(e["t"])) + f".{int(e['t'] * 1000) % 1000:03d}"
        table.add_row(stamp, e["code"], e["subject"], e["message"])
    console.print(table)


def print_conformance(console: Console, job: str, results: list[Any]) -> None:
    table = Table(title=f"Conformance of {job}")
    for col in ("spec", "asked", "reported", "measured", "verdict", "why"):
        table.add_column(col, overflow="fold")
    style = {"pass": "green", "fail": "red", "skip": "yellow"}
    for r in results:
        table.add_row(
            r.name,
            f"{r.asked:.2f}",
            "-" if r.reported is None else f"{r.reported:.3f}" + (f" (waited {r.waited:.3f})" if r.waited else ""),
            "-" if r.measured is None else f"{r.measured:.3f}" + (f" ({r.measured_by})" if r.measured_by else ""),
            Text(r.verdict, style=style[r.verdict]),
            "\n".join(r.why) or "-",
        )
    console.print(table)


def print_duty(console: Console, d: dict[str, Any]) -> None:
    console.print(Text(d["summary"], style="bold"))
    if d["rules"]:
        table = Table(title="Governors")
        for col in ("rule", "state", "budget", "ceiling", "baseline/s", "baseline age", "last pressure"):
            table.add_column(col)
        for r in d["rules"]:
            state = r["state"] + (f" ({r['take_back_left_s']:.0f}s left)" if r["take_back_left_s"] else "")
            table.add_row(
                r["rule"],
                state,
                f"{r['budget']:.2f}",
                f"{r['ceiling']:.2f}",
                "-" if r["baseline"] is None else f"{r['baseline']:.3g}",
                "-" if r["baseline_age_s"] is None else f"{r['baseline_age_s']:.0f}s",
                "-" if r["pressure"] is None else f"{100 * r['pressure']:.1f}%",
            )
        console.print(table)
    table = Table(title="Jobs")
    for col in ("job", "asked", "measured", "reported", "state", "why"):
        table.add_column(col, overflow="fold")
    for j in d["jobs"]:
        reported = j.get("reported")
        table.add_row(
            j["id"],
            f"{j['asked']:.2f}",
            "-" if j["measured"] is None else f"{j['measured']:.2f}",
            "-" if reported is None else f"{reported:.2f}",
            j["state"],
            _reasons(j["reasons"][:1]),
        )
    if not d["jobs"]:
        table.add_row("(none)", "", "", "", "", "")
    console.print(table)


def origin_of(c: dict[str, Any]) -> str:
    """Where a certificate came from, as `certificates` shows it."""
    if c.get("origin"):
        return f"adopted from {c['origin']} after a confirmation of {c.get('confirm_blocks', 0)} blocks"
    return "earned here"


def print_certificates(console: Console, certs: list[dict[str, Any]]) -> None:
    table = Table(title="Certificates")
    for col in ("rule", "work", "duty", "R [interval]", "margin", "origin", "status", "why"):
        table.add_column(col, overflow="fold")
    style = {"valid": "green", "expired": "yellow", "stale": "red"}
    for c in certs:
        table.add_row(
            c["rule"],
            c["work"],
            f"{c['duty']:.2f}",
            f"{c['r']:.3f} [{c['r_low']:.3f}, {c['r_high']:.3f}]",
            f"{c['margin']:.2f}",
            Text(escape_controls(origin_of(c))),  # a twin names itself in what it signed
            Text(c["status"], style=style[c["status"]]),
            c["why"],
        )
    if not certs:
        table.add_row("(none)", "", "", "", "", "", "", "run `arbiter ab sweep --rule RULE` to earn one")
    console.print(table)


def print_fleet_certificates(console: Console, answer: dict[str, Any]) -> None:
    """This node's certificates, then the twins' in the shared folder and what each came to."""
    print_certificates(console, answer["certificates"])
    fleet = answer.get("fleet")
    if not fleet:
        return
    console.print(
        Text(
            f"publishes to {fleet['folder']} as {fleet['node']}; its public key (list it under "
            f"fleet_certificates.trusted_keys on the twins): {fleet['public_key']}"
        )
    )
    table = Table(title="Twins' certificates")
    for col in ("file", "node", "rule", "status", "why"):
        table.add_column(col, overflow="fold")
    for f in fleet["files"]:  # what the files say is anyone's who can write the folder: never markup nor escapes
        why = f.get("why") or (f"run {f['run']}" if f.get("run") else "")
        cells = (f["file"], f.get("node", ""), f.get("rule", ""), f["status"], why)
        table.add_row(*(Text(escape_controls(str(x))) for x in cells))
    if not fleet["files"]:
        table.add_row("(none read yet)", "", "", "", "")
    console.print(table)


def print_gpu_apis(console: Console, a: dict[str, Any]) -> None:
    head = Text(f"{a.get('platform', '')}: ", style="bold")
    head.append(
        f"host provides {', '.join(a['host']) or 'no GPU API'}; containers get {', '.join(a['containers']) or 'none'}"
    )
    console.print(head)
    table = Table()
    table.add_column("api")
    table.add_column("usable")
    table.add_column("evidence", overflow="fold")
    for api, evidence in sorted(a.get("evidence", {}).items()):
        usable = api in a["host"] or (api == "containers" and bool(a["containers"]))
        table.add_row(api, Text("yes" if usable else "no", style="green" if usable else "red"), evidence)
    console.print(table)


def print_doctor_items(console: Console, items: list[dict[str, Any]]) -> None:
    """ok, FIX (with its fix), or n/a: no fault, but not usable here (an API this host lacks,
    a reader another one stands in for), with what would change that."""
    for item in items:
        word, style = (
            ("FIX  ", "bold red") if not item["ok"] else ("n/a  ", "yellow") if item["fix"] else ("ok   ", "green")
        )
        mark = Text(word, style=style)
        mark.append(f"{item['area']}: ", style="bold")
        mark.append(item["detail"])
        if item["fix"]:
            mark.append(f"\n     → {item['fix']}", style="cyan")
        console.print(mark)


def print_doctor_summary(console: Console, items: list[dict[str, Any]]) -> None:
    bad = sum(1 for i in items if not i["ok"])
    console.print(Text(f"\n{bad} item(s) to fix" if bad else "\nhealthy", style="bold red" if bad else "bold green"))


def print_doctor(console: Console, items: list[dict[str, Any]]) -> None:
    print_doctor_items(console, items)
    print_doctor_summary(console, items)
