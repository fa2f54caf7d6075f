"""A plugin that raises or hangs is isolated: its rule counts as harm and the daemon goes on."""

from __future__ import annotations

import textwrap
from pathlib import Path

from arbiter.demo.node import PYTHON, LocalNode

FLAKY = textwrap.dedent(
    """
    import os, time
    from arbiter.plugin import KindOptions, Matcher, hookimpl

    class Flaky(Matcher):
        class Options(KindOptions):
            mode: str = "raise"

        def select(self, processes):
            if os.path.exists(os.environ["FLAKY_OK"]):
                return set()
            if self.options.mode == "hang":
                time.sleep(3)  # past the timeout, then back
            raise RuntimeError("the matcher broke")

    @hookimpl
    def arbiter_register_matchers(register):
        register("flaky", Flaky)
    """
)


def test_failing_and_hanging_plugins_hold_gpu_work_and_say_why(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "flaky_site_plugin.py").write_text(FLAKY)
    node = LocalNode(tmp_path, plugins=["flaky_site_plugin"], plugin_timeout_s=0.5)
    ok = tmp_path / "ok"
    env = {**node.env(), "PYTHONPATH": str(tmp_path / "site"), "FLAKY_OK": str(ok)}
    node.env = lambda: env  # type: ignore[method-assign]
    try:
        node.add_rule("a", {"id": "a", "match": {"kind": "flaky", "mode": "raise"}, "protect": {"metric": "gpu_share"}})
        node.add_rule("b", {"id": "b", "match": {"kind": "flaky", "mode": "hang"}, "protect": {"metric": "gpu_share"}})
        node.start()
        node.job_run([PYTHON, "-c", "pass"], "--name", "held")
        node.wait_for(lambda: (node.job("held") or {}).get("state") == "held")
        messages = " ".join(r["message"] for r in node.job("held")["reasons"])
        assert "the matcher broke" in messages and "no answer within 0.5s" in messages
        failed = node.events("PLUGIN_FAILED", contains="matchers/flaky (b)")
        assert {e["subject"] for e in failed} >= {"a", "b"}
        ok.touch()  # the plugin recovers: work is admitted
        node.wait_for(lambda: node.job("held") is None, timeout=20)
    finally:
        node.close()
