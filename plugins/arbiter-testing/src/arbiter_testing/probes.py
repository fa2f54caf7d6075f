"""The probe tests' stand-ins for a host: a command runner that answers from a table, and a
maker of probes that look at that host instead of this one."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from arbiter.plugin import PluginContext
from arbiter_probes._host import Completed, HostProbe, Runner

Answer = Completed | BaseException | str | dict[str, Any]

P = TypeVar("P", bound=HostProbe)


class FakeRunner:
    """Answers a command from ``answers``, keyed by the program's base name (``vulkaninfo``) or,
    for the native child, by ``native:<what>``.  A program with no answer is not installed.
    A ``str`` answer is printed with exit 0; a ``dict`` is printed as the child's JSON report.
    """

    def __init__(self, answers: Mapping[str, Answer] | None = None) -> None:
        self.answers: dict[str, Answer] = dict(answers or {})
        self.calls: list[tuple[list[str], float, dict[str, str]]] = []

    def key(self, argv: Sequence[str]) -> str:
        if argv[0] == sys.executable:
            return f"native:{argv[-1]}"
        return os.path.basename(argv[0])

    def __call__(self, argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> Completed:
        self.calls.append((list(argv), timeout_s, dict(env)))
        answer = self.answers.get(self.key(argv))
        if answer is None:
            raise FileNotFoundError(2, "not found on PATH", argv[0])
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, dict):
            return Completed(0, json.dumps(answer) + "\n")
        if isinstance(answer, str):
            return Completed(0, answer)
        return answer

    @property
    def programs(self) -> list[str]:
        return [self.key(argv) for argv, _, _ in self.calls]


class MakeProbe(Protocol):
    """``make_probe(cls, run=..., env=..., root=..., platform=..., **options)``: a ``cls`` probe
    with ``options``, looking at ``root`` with ``env``, asking ``run`` (an empty
    :class:`FakeRunner` by default: nothing is installed)."""

    def __call__(
        self,
        cls: type[P],
        run: Runner | None = None,
        env: Mapping[str, str] | None = None,
        root: Path | str = "/nonexistent-root",
        platform: str = "linux",
        **options: Any,
    ) -> P: ...


def probe_maker(context: PluginContext) -> MakeProbe:
    """A :class:`MakeProbe` whose probes share ``context``."""

    def make(
        cls: type[P],
        run: Runner | None = None,
        env: Mapping[str, str] | None = None,
        root: Path | str = "/nonexistent-root",
        platform: str = "linux",
        **options: Any,
    ) -> P:
        opts = cls.Options.model_validate(options)
        return cls(opts, context, root=root, env=dict(env or {}), run=run or FakeRunner(), platform=platform)

    return make
