"""Bad input for every format arbiter reads: how many were accepted, rejected saying where, or crashed.

    uv run python bench/fuzz_configs.py [--inputs 10000] [--formats rule,node,...] [--show 5]

Each input (see tests/fuzz/kit.py for how they are made and judged) goes through the entry
point a user hits: the rule-file check on a file in a tenants dir, the node config loader,
``arbiter job run --manifest``'s manifest loading, the SDK's control-document reader, the job
event model and the daemon's reading of a job's events file, the jsonl and log sources following a real file, the daemon's Unix socket, and
the HTTP app.  Exits 1 when any input crashed, was refused without saying where, or was a
known-valid input refused.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def load_kit() -> ModuleType:
    return load_script(ROOT / "tests" / "fuzz" / "kit.py", "arbiter_fuzz_kit")


def run_format(
    kit: ModuleType, harness: Any, fmt: str, inputs: int, seed: int
) -> tuple[Counter[str], list[Any], float]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    counts: Counter[str] = Counter()
    failures: list[Any] = []

    # generate only: a failure is recorded with its input rather than shrunk, so the run goes on
    @fixed_seed(seed)
    @settings(
        max_examples=inputs,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(kit.cases(fmt))
    def one(case: Any) -> None:
        verdict = harness.feed(fmt, case)
        counts[verdict.outcome] += 1
        if verdict.outcome in kit.FAILURES:
            failures.append((verdict, case))

    started = time.monotonic()
    one()
    return counts, failures, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=10_000, help="inputs per format")
    parser.add_argument("--formats", default="", help="comma-separated; default every format")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--show", type=int, default=5, help="failing inputs shown per format")
    args = parser.parse_args(argv)
    kit = load_kit()
    formats = [f for f in args.formats.split(",") if f] or list(kit.FORMATS)
    unknown = set(formats) - set(kit.FORMATS)
    if unknown:
        parser.error(f"unknown formats {', '.join(sorted(unknown))}; known: {', '.join(kit.FORMATS)}")

    header = f"{'format':<9} {'inputs':>7} {'accepted':>9} {'rejected+where':>15} {'crashes':>8} {'no where':>9} {'valid refused':>14} {'time':>8}"
    rows = [header, "-" * len(header)]
    shown: list[str] = []
    bad = 0
    with tempfile.TemporaryDirectory(prefix="arbiter-fuzz-") as tmp:
        harness = kit.Harness(Path(tmp))
        try:
            for fmt in formats:
                counts, failures, took = run_format(kit, harness, fmt, args.inputs, args.seed)
                rows.append(
                    f"{fmt:<9} {sum(counts.values()):>7} {counts['accepted']:>9} {counts['rejected']:>15} "
                    f"{counts['crash']:>8} {counts['unlocated']:>9} {counts['wrong_reject']:>14} {took:>7.1f}s"
                )
                print(rows[-1], file=sys.stderr, flush=True)  # progress while the rest runs
                bad += len(failures)
                for verdict, case in failures[: args.show]:
                    shown.append(
                        f"{fmt} {verdict.outcome}: {verdict.detail}\n    input ({case.how}): {case.data[:300]!r}"
                        + (f" {case.extra!r}"[:300] if case.extra is not None else "")
                    )
        finally:
            harness.close()
    print("\n".join(rows))
    if shown:
        print("\nfailing inputs:\n" + "\n".join(shown))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
