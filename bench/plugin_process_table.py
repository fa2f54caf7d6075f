"""How long the process table takes to read, with ~300 processes on the host.

    uv run python bench/plugin_process_table.py [--processes 300] [--rounds 30]

Starts idle processes until the host has about ``--processes``, then times the table as the
tick reads it (``/proc`` on Linux, scanned by a child worker through the memo that keeps what
cannot have changed and each process's stat file open), the same memo scanning in this
process, the memo keeping no files open, a read without the memo, and psutil's, and prints
p50/p99 in milliseconds and the calling thread's CPU time a read (what holds the daemon's
interpreter: the child's own CPU is not in it).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable, Sized

import psutil

from arbiter_matchers.table import TableMemo, process_table, psutil_table


def timed(read: Callable[[], Sized], rounds: int) -> tuple[float, float, float, int]:
    """p50 and p99 of the wall time, the mean CPU time of the calling thread (ms), the size."""
    read()  # warm the page cache and the user name lookups (and start a child)
    samples = []
    size = 0
    cpu = time.thread_time()
    for _ in range(rounds):
        started = time.perf_counter()
        size = len(read())
        samples.append((time.perf_counter() - started) * 1000)
    cpu_ms = (time.thread_time() - cpu) * 1000 / rounds
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))], cpu_ms, size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    extra = max(0, args.processes - len(psutil.pids()))
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(extra)]
    try:
        in_child, memo, memo_unkept = TableMemo(in_child=True), TableMemo(), TableMemo()
        memo_unkept._scan._limit = 0  # every stat file opened and closed each scan
        for label, read in (
            ("memo, in a child", in_child.table),  # as the tick reads it
            ("memo, here", memo.table),  # as it reads it when the child failed
            ("  memo, no kept files", memo_unkept.table),
            ("process_table, bare", process_table),
            ("psutil_table", psutil_table),
        ):
            p50, p99, cpu_ms, size = timed(read, args.rounds)
            print(
                f"{label:22s} {size} processes: p50 {p50:.1f} ms, p99 {p99:.1f} ms; "
                f"CPU of the calling thread {cpu_ms:.2f} ms a read"
            )
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()


if __name__ == "__main__":
    main()
