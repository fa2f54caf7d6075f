"""``arbiter demo --proof``: a short paired ON/OFF run earns a certificate, and under
``gpu_jobs: certified`` the governor then runs the cooperative job beside the protected
program and takes its budget back when the program slows down."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from arbiter.api.ops import Op
from arbiter.api.transport import RequestRefused
from arbiter.cli.render import console as plain_console
from arbiter.cli.render import print_certificates
from arbiter.cli.story import (
    RULE_ID,
    DemoFailed,
    Rate,
    demo_node,
    must_show,
    show,
    start_job,
    start_protected,
    state_of,
)
from arbiter.demo.node import LocalNode
from arbiter.harness.report import text as report_text


def _governor(node: LocalNode) -> str:
    rules = node.call(Op.DUTY)["duty"]["rules"]
    return str(rules[0]["state"]) if rules else ""


#: a short paired run (a real one takes hours: 12 blocks of 5-minute windows)
DEMO_RUN = {
    "work": "batch-coop",
    "duty": 0.2,
    "blocks": 4,
    "window": 2.5,
    "washout": 0.5,
    "margin": 0.1,
    "max_hours": 0.05,
}


def _runstate_of(node: LocalNode, run_id: str) -> dict[str, Any]:
    return next((r for r in node.call(Op.AB_STATUS)["runs"] if r["run"] == run_id), {})


#: how long the proof's paired run may take before it is called undecided
PROOF_S = 240


def run_proof(keep: bool = False, console: Console | None = None) -> int:
    console = console or plain_console()
    started = time.monotonic()
    title = (
        "One core stands in for the GPU. A paired ON/OFF run measures what a cooperative job costs\n"
        "the protected program; its certificate lets the job run beside it under a budget."
    )
    try:
        with demo_node(keep, console, "certified", title) as (node, root, events):
            slow = root / "protected.slow"
            rate = Rate(events)
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                start_job(node, root, "batch-coop", "--cooperative")
                protected = start_protected(node, root, events)
                must_show(
                    live,
                    node,
                    "1. The protected program works: without a certificate the job waits (GPU_NOT_CERTIFIED)",
                    rate,
                    30,
                    # a run measures the program working: it waits until the daemon has seen it
                    # run (its source may show a rate a tick before that)
                    lambda: (
                        node.job("batch-coop") is not None
                        and (rule := node.status()["rules"][0])["running"]
                        and bool(rule["sources"][0]["rate"])
                    ),
                )
                run_id = node.call(Op.AB_START, rule=RULE_ID, **DEMO_RUN)["plan"]["run"]
                show(
                    live,
                    node,
                    f"2. A paired ON/OFF run ({run_id}) holds the job in random OFF windows and runs it "
                    f"at duty {DEMO_RUN['duty']} in ON windows",
                    rate,
                    PROOF_S,
                    lambda: _runstate_of(node, run_id).get("status") not in (None, "running"),
                    proof=True,
                )
                if _runstate_of(node, run_id).get("status") == "running":
                    with contextlib.suppress(RequestRefused):  # it may have ended just now
                        node.call(Op.AB_ABORT, id=run_id)
                proof = node.call(Op.AB_SHOW, id=run_id)["report"]
                console.print(Text(f"\n$ arbiter ab show {run_id}", style="bold"))
                console.print(report_text(proof), markup=False, highlight=False)
                if not proof["certifies"]:
                    raise DemoFailed(
                        f"the paired run earned no certificate ({proof['verdict'] or proof['why'] or proof['status']}): "
                        "a machine this busy cannot show the program unharmed; run it again when it is quieter"
                    )
                show(
                    live,
                    node,
                    "3. Certified: the governor runs the cooperative job beside the program, after a baseline",
                    rate,
                    20,
                    lambda: _governor(node) == "running" and state_of(node, "batch-coop") == "run",
                    proof=True,
                )
                slow.write_text("1.0")
                show(
                    live,
                    node,
                    "4. The protected program slows down: the budget is taken back at once",
                    rate,
                    15,
                    lambda: _governor(node) == "taken back",
                    proof=True,
                )
                slow.write_text("0")
                show(
                    live,
                    node,
                    "5. It keeps up again: after take_back_s the budget comes back",
                    rate,
                    15,
                    lambda: _governor(node) == "running" and state_of(node, "batch-coop") == "run",
                    proof=True,
                )
            console.print(Text("\n$ arbiter certificates", style="bold"))
            certs = node.call(Op.CERTIFICATES)["certificates"]
            print_certificates(console, certs)
            protected.terminate()
        console.print(
            Text(
                f"proof done in {time.monotonic() - started:.0f}s: a certificate earned; nothing is left running.",
                style="bold green",
            )
        )
        return 0
    except (DemoFailed, TimeoutError, RuntimeError, RequestRefused) as exc:
        console.print(Text(f"the proof failed: {exc}", style="red"))
        return 1
