"""A process inside the tree of a rule that walks trees goes with that rule, unless the rule
that took it first ranks higher: llama-swap's llama-server children are llama-swap's
(released through it), while a llama-server started by itself stays the llama-server rule's,
and a protected game started from a launcher stays the game's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arbiter.daemon.claim import Claimer
from arbiter.plugin import Matcher, ProcessInfo
from arbiter.pluginmanager import PluginFailed
from arbiter_matchers.process import ProcessMatcher, ProcessOptions


@dataclass
class _Match:
    kind: str = "process"


@dataclass
class _Rule:
    id: str
    match: _Match = field(default_factory=_Match)
    priority: int = 50


@dataclass
class Live:
    rule: _Rule
    matcher: Matcher | None
    faults: list[str] = field(default_factory=list)


def call(label: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise PluginFailed(label, str(exc)) from exc


def matcher(**options: Any) -> ProcessMatcher:
    return ProcessMatcher(ProcessOptions(**options))


TABLE = [
    ProcessInfo(pid=100, ppid=1, name="llama-swap", cmdline=("llama-swap", "--config", "c.yaml")),
    ProcessInfo(pid=101, ppid=100, name="llama-server", cmdline=("llama-server", "-m", "qwen.gguf")),
    ProcessInfo(pid=102, ppid=101, name="llama-server-helper"),
    ProcessInfo(pid=200, ppid=1, name="llama-server", cmdline=("llama-server", "-m", "own.gguf")),
]


def test_a_proxys_children_go_with_the_proxy_and_a_server_alone_with_its_own_rule() -> None:
    # same priority: llama-server sorts first and takes every llama-server process
    rules: list[Any] = [
        Live(_Rule("llama-server"), matcher(name=["llama-server"])),
        Live(_Rule("llama-swap"), matcher(name=["llama-swap"], tree="descendants")),
    ]
    claimer = Claimer(call)
    pids, faults = claimer.claim(rules, TABLE)
    assert pids["llama-swap"] == frozenset({100, 101, 102})
    assert pids["llama-server"] == frozenset({200})
    assert claimer.moved == {101: ("llama-server", "llama-swap")}
    assert faults == {"llama-server": [], "llama-swap": []}


def test_the_outermost_tree_owns_what_nested_trees_hold() -> None:
    table = [
        ProcessInfo(pid=10, ppid=1, name="outer"),
        ProcessInfo(pid=11, ppid=10, name="inner"),
        ProcessInfo(pid=12, ppid=11, name="worker"),
    ]
    rules: list[Any] = [
        Live(_Rule("inner"), matcher(name=["inner"], tree="descendants")),  # claims first
        Live(_Rule("outer"), matcher(name=["outer"], tree="descendants")),
    ]
    pids, _ = Claimer(call).claim(rules, table)
    assert pids == {"inner": frozenset(), "outer": frozenset({10, 11, 12})}


def test_a_higher_ranked_rule_keeps_what_it_selects_inside_a_lower_tree() -> None:
    table = [
        ProcessInfo(pid=10, ppid=1, name="launcher"),
        ProcessInfo(pid=11, ppid=10, name="game"),
        ProcessInfo(pid=12, ppid=10, name="helper"),
    ]
    rules: list[Any] = [
        Live(_Rule("game", priority=100), matcher(name=["game"])),
        Live(_Rule("launcher", priority=40), matcher(name=["launcher"], tree="descendants")),
    ]
    claimer = Claimer(call)
    pids, _ = claimer.claim(rules, table)
    assert pids == {"game": frozenset({11}), "launcher": frozenset({10, 12})}
    assert claimer.moved == {}
