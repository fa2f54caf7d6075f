"""Skip a test whose tools are missing here, unless CI says it installed them.

``.ci/run`` installs what some tests need where it can (Vulkan and OpenCL on the CPU, a
headless browser, a Slurm cluster) and then names those APIs in ``ARBITER_REQUIRE``
(``vulkan,opencl,browser,slurm``).  There a missing tool fails the test instead of skipping
it, so that a broken install cannot pass as a skipped test.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_VAR = "ARBITER_REQUIRE"


def required(api: str) -> bool:
    """Whether this run promised that ``api`` is installed."""
    return api in {part.strip() for part in os.environ.get(REQUIRE_VAR, "").split(",")}


def need(api: str, why: str) -> None:
    """Go on where ``why`` is empty; else skip the test, saying ``why`` it cannot run here, or
    fail it where ``ARBITER_REQUIRE`` names ``api``."""
    if not why:
        return
    if required(api):
        pytest.fail(f"{REQUIRE_VAR} names {api} but {why}")
    pytest.skip(why)


def need_tool(tool: str, api: str) -> None:
    """:func:`need` for a program on ``PATH`` that stands for ``api``."""
    need(api, "" if shutil.which(tool) is not None else f"{tool} is not installed")
