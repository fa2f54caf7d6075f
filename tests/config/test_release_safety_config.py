"""release_when_busy says when a release is safe: it needs a release, and takes one of three
values, each said where the rule is judged."""

from __future__ import annotations

from collections.abc import Callable

BASE = "id: t\nmatch: {name: [x]}\nbase_url: http://127.0.0.1:9\n"


Problems = Callable[[str], list[str]]


def test_release_when_busy_needs_a_release_and_one_of_its_values(rule_problems: Problems) -> None:
    assert any("add a release: block" in p for p in rule_problems(BASE + "release_when_busy: wait\n"))
    said = rule_problems(BASE + "release: {kind: http_post, url: /free}\nrelease_when_busy: later\n")
    assert said and "release_when_busy" in said[0] and "'wait'" in said[0]
    assert (
        rule_problems(BASE + "release: {kind: http_post, url: /free}\nrelease_when_busy: skip\ndrain_timeout_s: 5\n")
        == []
    )
