"""How long the process table takes to read, with ~300 processes on the host.

    uv run python bench/plugin_process_table.py [--processes 300] [--rounds 30]

Starts idle processes until the host has about ``--processes``, then times the table as the
tick reads it (``/proc`` on Linux, through the memo that keeps what cannot have changed and
each process's stat file open), the memo keeping no files open, a read without the memo,
and psutil's, and prints p50/p99 in milliseconds.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable

import psutil

from arbiter_matchers.table import TableMemo, process_table, psutil_table


def timed(read: Callable[[], list[object]], rounds: int) -> tuple[float, float, int]:
    read()  # warm the page cache and the user name lookups
    samples = []
    size = 0
    for _ in range(rounds):
        started = time.perf_counter()
        size = len(read())
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))], size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    extra = max(0, args.processes - len(psutil.pids()))
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    try:
        memo, memo_unkept = TableMemo(), TableMemo()
        memo_unkept._scanners.scan._limit = 0  # every stat file opened and closed each scan
        for label, read in (
            ("process_table, memo", memo.table),  # as the tick reads it
            ("  memo, no kept files", memo_unkept.table),
            ("process_table, bare", process_table),
            ("psutil_table", psutil_table),
        ):
            p50, p99, size = timed(read, args.rounds)
            print(f"{label:22s} {size} processes: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()


if __name__ == "__main__":
    main()
