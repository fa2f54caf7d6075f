"""``status --watch`` and ``timeline --follow``: the same views, kept current until Ctrl-C.

On a terminal the status is redrawn in place; into a file or a pipe, where a redraw would be
lost, each status that differs from the last is printed below it, and the timeline prints one
line per new entry (JSON lines with ``--json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from arbiter.cli.render import print_timeline, status_renderable

Ask = Callable[[], Any]
Sleep = Callable[[float], None]


def timeline_line(e: dict[str, Any]) -> Text:
    stamp = time.strftime("%H:%M:%S", time.localtime(e["t"])) + f".{int(e['t'] * 1000) % 1000:03d}"
    line = Text(f"{stamp} ")
    line.append(e["code"], style="bold")
    line.append(f" {e['subject']}: {e['message']}")
    return line


def follow_timeline(ask: Ask, console: Console, as_json: bool, every_s: float = 1.0, sleep: Sleep = time.sleep) -> None:
    """The latest entries, then each new one as it is recorded."""
    events = ask()
    if as_json:
        for e in events:
            print(json.dumps(e, default=str), flush=True)
    else:
        print_timeline(console, events)
    last = max((e["id"] for e in events), default=0)
    try:
        while True:
            sleep(every_s)
            for e in ask():
                if e["id"] > last:
                    last = e["id"]
                    if as_json:
                        print(json.dumps(e, default=str), flush=True)
                    else:
                        console.print(timeline_line(e))
    except KeyboardInterrupt:
        return


def _essence(s: dict[str, Any]) -> str:
    """What a reader of a log wants a new status for: a job's state, duty or holds, a
    tenant's running, use of the GPU, phases or holds, a notice; not a figure that moved."""
    jobs = [(j["id"], j["state"], round(j["duty"], 2), [r["code"] for r in j["reasons"]]) for j in s["jobs"]]
    rules = [(r["id"], r["running"], r["using_gpu"], r["phases"], [h["code"] for h in r["holds"]]) for r in s["rules"]]
    notices = [n["code"] for n in s["notices"]]
    return json.dumps([jobs, rules, notices, s.get("problems", {})], default=str)


def watch_status(ask: Ask, console: Console, as_json: bool, every_s: float = 2.0, sleep: Sleep = time.sleep) -> None:
    """The status, redrawn every ``every_s`` on a terminal; elsewhere, printed when it changes."""
    try:
        if console.is_terminal and not as_json:
            with Live(status_renderable(ask()), console=console, auto_refresh=False) as live:
                while True:
                    sleep(every_s)
                    live.update(status_renderable(ask()), refresh=True)
        shown = None
        while True:
            s = ask()
            essence = _essence(s)
            if essence != shown:
                shown = essence
                if as_json:
                    print(json.dumps(s, default=str), flush=True)
                else:
                    console.print(Text(time.strftime("--- %H:%M:%S"), style="bold"))
                    console.print(status_renderable(s))
            sleep(every_s)
    except KeyboardInterrupt:
        return
