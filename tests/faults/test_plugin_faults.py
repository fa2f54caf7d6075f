"""Plugins that raise, hang or return garbage: a matcher, a phase source and a translator.

Each plugin works, then is switched into its fault mid-run through a file the test writes
(its own process reads it, as a broken plugin would break on its own).  Its rule counts as
harm (SPEC section 3, "Plugins"): fleet work waits, PLUGIN_FAILED goes on the timeline,
``explain`` names it with a remedy, and the daemon goes on."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.node import PYTHON, HarnessNode

from .conftest import Scene

FAULTY = textwrap.dedent(
    """
    import math, os, time
    from arbiter.plugin import KindOptions, Matcher, Source, SourceState, Translator, hookimpl

    def fault(part):
        try:
            with open(os.path.join(os.environ["FAULTS_DIR"], part)) as fh:
                return fh.read().strip()
        except FileNotFoundError:
            return ""

    class Flaky(Matcher):
        class Options(KindOptions):
            marker: str

        def select(self, processes):
            mode = fault("matcher")
            if mode == "raise":
                raise RuntimeError("the matcher broke")
            if mode == "hang":
                time.sleep(6)
            if mode == "none":
                return None
            if mode == "names":
                return {"not-a-pid"}
            return {p.pid for p in processes if self.options.marker in " ".join(p.cmdline)}

    class FlakyPhase(Source):
        def start(self, on_change):
            self.on_change = on_change

        def state(self):
            mode = fault("source")
            if mode == "raise":
                raise RuntimeError("the phase source broke")
            if mode == "hang":
                time.sleep(6)
            if mode == "not_a_state":
                return {"phase": "off"}
            if mode == "bad_phase":
                return SourceState(phase="maybe")
            if mode == "nan":
                return SourceState(phase="off", rate=math.nan)
            if mode == "negative":
                return SourceState(phase="off", count=-5)
            return SourceState(phase="off", changed_at=time.monotonic())

    class FlakyPause(Translator):
        actions = frozenset({"pause"})

        def pause(self, target):
            raise RuntimeError("the pause translator broke")

        def resume(self, refs):
            pass

    @hookimpl
    def arbiter_register_matchers(register):
        register("flaky", Flaky)

    @hookimpl
    def arbiter_register_sources(register):
        register("flaky_phase", FlakyPhase)

    @hookimpl
    def arbiter_register_translators(register):
        register("flaky_pause", FlakyPause)
    """
)


def with_plugin(scene: Scene, **config: Any) -> Path:
    """The scene's node loads the faulty plugin; the folder of its fault switches."""
    site, faults = scene.root / "site", scene.root / "faults"
    site.mkdir()
    faults.mkdir()
    (site / "faults_site_plugin.py").write_text(FAULTY)
    node: HarnessNode = scene.node
    node.config.update(plugins=["faults_site_plugin"], plugin_timeout_s=2.0, **config)
    node.write_config()
    env = {**node.env(), "PYTHONPATH": str(site), "FAULTS_DIR": str(faults)}
    node.env = lambda: env  # type: ignore[method-assign]
    return faults


def flaky_rule() -> dict[str, Any]:
    return {
        "id": "prot",
        "match": {"kind": "flaky", "marker": "faults-protected-standin"},
        "protect": {"metric": "gpu_share"},
        "during": [{"source": {"kind": "flaky_phase"}, "pause_fleet": {"scope": "gpu"}}],
    }


MATCHER = {
    "raise": "the matcher broke",
    "hang": "no answer within 2s",
    "none": "returned garbage: it returned NoneType",
    "names": "returned garbage: 'not-a-pid' is not a pid",
}


@pytest.mark.parametrize("mode", list(MATCHER))
def test_a_matcher_that_fails_holds_fleet_work_and_is_named(scene: Scene, mode: str) -> None:
    faults = with_plugin(scene)
    scene.node.add_rule("prot", flaky_rule())
    scene.start()
    scene.run_job("fleet")
    (faults / "matcher").write_text(mode)
    scene.held("fleet", "PLUGIN_FAILED", says=MATCHER[mode])
    failed = scene.node.events("PLUGIN_FAILED", subject="prot", contains=MATCHER[mode])
    assert failed
    assert "disable_plugins" in scene.explained("PLUGIN_FAILED", "fleet")["remedy"]
    scene.assert_alive()
    scene.assert_protected_untouched()
    (faults / "matcher").unlink()  # it recovers: the work goes on
    scene.node.wait_for(lambda: scene.node.known_job("fleet")["state"] == "run", timeout=30)
    scene.assert_protected_untouched()


SOURCE = {
    "raise": "the phase source broke",
    "hang": "no answer within 2s",
    "not_a_state": "returned garbage: it gave dict, not a SourceState",
    "bad_phase": "returned garbage: phase is 'maybe'",
    "nan": "returned garbage: rate is nan",
    "negative": "returned garbage: count is -5",
}


@pytest.mark.parametrize("mode", list(SOURCE))
def test_a_phase_source_that_fails_counts_as_on_and_is_named(scene: Scene, mode: str) -> None:
    faults = with_plugin(scene)
    scene.node.add_rule("prot", flaky_rule())
    scene.start()
    scene.run_job("fleet")
    (faults / "source").write_text(mode)
    reason = scene.held("fleet", "PROTECTION_SOURCE_UNREADABLE", says=SOURCE[mode])
    assert "counts as on" in reason["message"]
    scene.explained("PROTECTION_SOURCE_UNREADABLE", "fleet")
    scene.assert_alive()
    scene.assert_protected_untouched()
    (faults / "source").unlink()
    scene.node.wait_for(lambda: scene.node.known_job("fleet")["state"] == "run", timeout=30)


def test_a_pause_translator_that_raises_is_named_and_tried_again(scene: Scene) -> None:
    with_plugin(scene, translators={"pause": ["flaky_pause"]})
    scene.protect()
    scene.start()
    scene.run_job("fleet")
    scene.gpu(0.8)  # the protected program starts working: the job must pause, and cannot
    scene.held("fleet", "PROTECTED_GPU_BUSY")
    failed = scene.node.events("PLUGIN_FAILED", contains="the pause translator broke")
    assert failed
    problem = scene.explained("PLUGIN_FAILED", "fleet")
    assert "the pause translator broke" in problem["message"] and "translators:" in problem["remedy"]
    scene.ticks(3)  # it is tried again on every decision, and still named
    assert [p["code"] for p in scene.node.known_job("fleet")["problems"]] == ["PLUGIN_FAILED"]
    scene.assert_alive()
    scene.assert_protected_untouched()


def test_the_matcher_that_raises_or_hangs_recovers_per_rule(tmp_path: Path) -> None:
    """Two rules, one plugin raising for one and hanging for the other: both are named."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "flaky_site_plugin.py").write_text(
        textwrap.dedent(
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
    )
    node = HarnessNode(tmp_path, plugins=["flaky_site_plugin"], plugin_timeout_s=0.5)
    ok = tmp_path / "ok"
    env = {**node.env(), "PYTHONPATH": str(site), "FLAKY_OK": str(ok)}
    node.env = lambda: env  # type: ignore[method-assign]
    try:
        node.add_rule("a", {"id": "a", "match": {"kind": "flaky", "mode": "raise"}, "protect": {"metric": "gpu_share"}})
        node.add_rule("b", {"id": "b", "match": {"kind": "flaky", "mode": "hang"}, "protect": {"metric": "gpu_share"}})
        node.start()
        node.job_run([PYTHON, "-c", "pass"], "--name", "held")
        node.wait_for(lambda: (node.job("held") or {}).get("state") == "held")
        messages = " ".join(r["message"] for r in node.known_job("held")["reasons"])
        assert "the matcher broke" in messages and "no answer within 0.5s" in messages
        assert {r["code"] for r in node.known_job("held")["reasons"]} == {"PLUGIN_FAILED"}
        failed = node.events("PLUGIN_FAILED", contains="matchers/flaky (b)")
        assert {e["subject"] for e in failed} >= {"a", "b"}
        ok.touch()  # the plugin recovers: work is admitted
        node.wait_for(lambda: node.job("held") is None, timeout=20)
    finally:
        node.close()
