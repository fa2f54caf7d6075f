"""What the config tests share: the installed plugins, as the daemon loads them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from arbiter.pluginmanager import PluginHost, build_plugin_manager


@pytest.fixture(scope="module")
def host() -> Iterator[PluginHost]:
    """The installed plugins (one manager a test module), closed after the module."""
    host = build_plugin_manager()
    yield host
    host.close()
