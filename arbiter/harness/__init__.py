"""The paired ON/OFF harness: reports of its runs (the runs themselves are stepped by arbiter.engine.abrun)."""
