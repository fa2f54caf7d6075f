"""A daemon loads this plugin for its two kinds: what else it holds (the fake servers, an
HTTP server, a websocket library) loads only when a test asks for it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "arbiter_testing.fake_servers",
    "arbiter_testing.users",
    "arbiter_testing.vram_board",
    "http.server",
    "websockets",
)

CHECK = f"""
import json, sys
import arbiter_testing
before = [m for m in {HEAVY!r} if m in sys.modules]
arbiter_testing.FakeLlmServer, arbiter_testing.run_as, arbiter_testing.GIB
print(json.dumps([before, [m for m in {HEAVY!r} if m in sys.modules]]))
"""


def test_the_plugin_loads_no_helper_until_one_is_asked_for() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60)
    before, after = json.loads(out.stdout)
    assert before == []
    assert after == list(HEAVY)


def test_an_unknown_name_is_an_attribute_error() -> None:
    import arbiter_testing

    with pytest.raises(AttributeError, match="NoSuchHelper"):
        arbiter_testing.NoSuchHelper  # noqa: B018
