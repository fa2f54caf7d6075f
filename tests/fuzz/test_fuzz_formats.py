"""Every input format under generated bad input: nothing crashes, every refusal says where.

A few hundred inputs per format, with a fixed seed so CI sees the same ones each run;
``bench/fuzz_configs.py`` runs ten thousand per format with the same kit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load_kit() -> ModuleType:
    return load_script(ROOT / "tests" / "fuzz" / "kit.py", "arbiter_fuzz_kit")


kit = _load_kit()

#: inputs per format: the slower entry points (a followed file, a rule file read several times over) get fewer
EXAMPLES = {
    "rule": 200,
    "node": 250,
    "manifest": 250,
    "control": 300,
    "event": 300,
    "jsonl": 150,
    "log": 150,
    "socket": 250,
    "http": 250,
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    h = kit.Harness(tmp_path_factory.mktemp("fuzz"))
    yield h
    h.close()


@pytest.mark.parametrize("fmt", kit.FORMATS)
def test_no_crash_and_every_refusal_says_where(harness: object, fmt: str) -> None:
    counts: Counter[str] = Counter()
    failures: list[str] = []

    @seed(1201)
    @settings(
        max_examples=EXAMPLES[fmt],
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(kit.cases(fmt))
    def one(case: object) -> None:
        verdict = harness.feed(fmt, case)  # type: ignore[attr-defined]
        counts[verdict.outcome] += 1
        if verdict.outcome in kit.FAILURES:
            failures.append(f"{verdict.outcome}: {verdict.detail}\n  input ({case.how}): {case.data[:300]!r}")  # type: ignore[attr-defined]

    one()
    assert not failures, "\n".join(failures[:5])
    # the inputs reached both sides of the entry point, or the run says little
    assert counts["accepted"] > 0 and counts["rejected"] > 0, dict(counts)


def test_seeds_are_accepted(harness: object) -> None:
    """The shipped and example files themselves, through the same entry points."""
    for fmt, seeds in (("rule", kit.rule_seeds()), ("node", kit.node_seeds()), ("manifest", kit.manifest_seeds())):
        for text in seeds:
            verdict = harness.feed(fmt, kit.Case(text.encode(), True, "seed"))  # type: ignore[attr-defined]
            assert verdict.outcome == "accepted", (fmt, text[:80], verdict)
    for fmt, lines in (("control", kit.control_seeds()), ("event", kit.event_seeds())):
        for data in lines:
            assert harness.feed(fmt, kit.Case(data, True, "seed")).outcome == "accepted", (fmt, data)  # type: ignore[attr-defined]
