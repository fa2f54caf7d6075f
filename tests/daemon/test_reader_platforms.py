"""A reader for another platform is not tried without `readers:` in the node config, so
`arbiter doctor` does not list it as a fault to fix (an Apple GPU reader on Linux)."""

from __future__ import annotations

import sys

import pytest

from arbiter.config.models import NodeConfig
from arbiter.daemon.observe import Observer
from arbiter.pluginmanager import build_plugin_manager


@pytest.mark.skipif(sys.platform == "darwin", reason="checks a host that is not macOS")
def test_the_macos_reader_is_not_tried_elsewhere() -> None:
    host = build_plugin_manager([], [])
    observer = Observer(NodeConfig(), host)
    try:
        names = [name for name, _, _ in observer.readers]
        assert "macos_ioreg" not in names and names  # the others still are
        # named in the config, it is tried, and says why it cannot read
        named = Observer(NodeConfig(readers=["macos_ioreg"]), host)
        assert [name for name, _, _ in named.readers] == ["macos_ioreg"]
        named.close()
    finally:
        observer.close()
        host.close()
