"""The daemon's processes cap their malloc arenas: under glibc each thread that allocates
would take one of its own, up to eight per core."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

try:
    GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
except (ValueError, OSError):
    GLIBC = False

pytestmark = pytest.mark.skipif(not GLIBC, reason="the arena cap is glibc's")

# eight threads allocate at once, then glibc counts its arenas on standard error
CHECK = """
import ctypes, sys, threading
from arbiter.reflex.limits import cap_malloc_arenas
print(cap_malloc_arenas(int(sys.argv[1])) if sys.argv[1] != "-" else None, flush=True)
together = threading.Barrier(8)
def allocate():
    together.wait()
    blocks = [bytearray(4096) for _ in range(200)]
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.stderr.flush()
ctypes.CDLL(None).malloc_stats()
"""


def arenas_after(cap: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run(
        [sys.executable, "-c", CHECK, cap], capture_output=True, text=True, check=True, timeout=60, env=environ
    )
    return out.stdout.strip(), sum(1 for line in out.stderr.splitlines() if line.startswith("Arena "))


def test_capped_arenas_stay_at_the_cap_where_eight_threads_would_take_more() -> None:
    _, uncapped = arenas_after("-")
    assert uncapped > 2, f"eight threads took {uncapped} arena(s) uncapped: this check proves nothing here"
    assert arenas_after("2") == ("True", 2)


def test_a_cap_in_the_environment_is_the_persons_and_stands() -> None:
    said, arenas = arenas_after("2", MALLOC_ARENA_MAX="3")
    assert said == "False"
    assert arenas == 3
