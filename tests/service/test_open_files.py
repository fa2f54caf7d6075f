"""The daemon raises its soft open-file limit, so that what plugins keep open between ticks
(a share of that limit) covers a thousand processes under a service manager's 1024."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

resource = pytest.importorskip("resource")

CHECK = """
import json, resource, sys
from arbiter.reflex.limits import raise_open_file_limit
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
raised = raise_open_file_limit(int(sys.argv[3]))
print(json.dumps([raised, resource.getrlimit(resource.RLIMIT_NOFILE)]))
"""


def limits_after(soft: int, hard: int, wanted: int) -> list[Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(soft), str(hard), str(wanted)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    limits: list[Any] = json.loads(out.stdout)  # [raised, [soft, hard]]
    return limits


def test_the_soft_limit_is_raised_to_what_is_wanted_never_past_the_hard_one() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard open-file limit here is {hard}")
    assert limits_after(256, 512, 400) == [[256, 400], [400, 512]]
    assert limits_after(256, 512, 4096) == [[256, 512], [512, 512]]  # the hard limit caps it
    assert limits_after(450, 512, 400) == [None, [450, 512]]  # already enough: left alone
