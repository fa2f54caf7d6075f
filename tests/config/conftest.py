"""What the config tests share: the installed plugins, as the daemon loads them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from arbiter.config.loader import check_paths
from arbiter.pluginmanager import PluginHost, build_plugin_manager


@pytest.fixture(scope="module")
def host() -> Iterator[PluginHost]:
    """The installed plugins (one manager a test module), closed after the module."""
    host = build_plugin_manager()
    yield host
    host.close()


@pytest.fixture
def rule_problems(host: PluginHost, tmp_path: Path) -> Callable[[str], list[str]]:
    """What ``arbiter check`` says of a rule file of the given text (``t.yaml`` in a folder of its
    own), one message a problem."""

    def check(text: str) -> list[str]:
        (tmp_path / "t.yaml").write_text(text)
        found = check_paths([tmp_path], host.options_model, host.kind_names).problems.get(str(tmp_path / "t.yaml"), [])
        return [str(p) for p in found]

    return check
