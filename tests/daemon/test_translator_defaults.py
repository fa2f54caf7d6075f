"""Which translator serves each action when the node config names none, and why the reflex
process may not run: both said where a user looks."""

from __future__ import annotations

from typing import Any

from arbiter.config.models import NodeConfig
from arbiter.daemon.linked import reflex_process
from arbiter.pluginmanager import build_plugin_manager
from arbiter.reflex.act import default_translators


def test_the_default_order_is_by_rank_and_a_pause_that_does_not_bound_its_time_comes_last() -> None:
    host = build_plugin_manager()
    try:
        order = default_translators(host, "pause")
        kinds = host.translators()
        assert order and set(order) == {n for n, info in kinds.items() if "pause" in info.cls.actions}
        ranks = [kinds[n].cls.rank for n in order]
        assert ranks == sorted(ranks)
        bounded = [kinds[n].cls.bounded for n in order]
        assert bounded == sorted(bounded, reverse=True), f"an unbounded pause ranks before a bounded one: {order}"
    finally:
        host.close()


class Unbounded:
    bounded = False


def test_the_reflex_process_says_why_it_does_not_run() -> None:
    host = build_plugin_manager(entry_points=False)
    args: Any = (None, None, None, None)  # not reached: each answer comes before they are used
    try:
        off = NodeConfig.model_validate({"reflex_process": False})
        assert reflex_process(off, host, {}, *args) == (None, "reflex_process: false in the node config")
        on = NodeConfig()
        assert reflex_process(on, host, {}, *args)[1] == "no pause translator is available here"
        linked, why = reflex_process(on, host, {"pause": ("slowpause", Unbounded())}, *args)  # type: ignore[dict-item]
        assert linked is None and "'slowpause' does not bound its own time" in why
    finally:
        host.close()
