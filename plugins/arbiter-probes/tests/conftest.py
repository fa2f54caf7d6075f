"""Shared fakes for the probe tests: a command runner that answers from a table, and fixture paths."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from arbiter.plugin import PluginContext
from arbiter_probes._host import Completed

FIXTURES = Path(__file__).parent / "fixtures"

Answer = Completed | BaseException | str | dict[str, Any]


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


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def context(tmp_path: Path) -> PluginContext:
    return PluginContext(state_dir=tmp_path)


@pytest.fixture
def make_probe(context: PluginContext) -> Callable[..., Any]:
    """``make_probe(cls, run=..., env=..., root=..., platform=..., **options)``."""

    def make(
        cls: Any,
        run: Any = None,
        env: Mapping[str, str] | None = None,
        root: Path | str = "/nonexistent-root",
        platform: str = "linux",
        **options: Any,
    ) -> Any:
        opts = cls.Options.model_validate(options)
        return cls(opts, context, root=root, env=dict(env or {}), run=run or FakeRunner(), platform=platform)

    return make


@pytest.fixture
def runner_class() -> type[FakeRunner]:
    return FakeRunner


@pytest.fixture
def require_tool() -> Callable[[str, str], None]:
    """``require_tool(tool, api)``: skip unless ``tool`` is installed, or fail where
    ``ARBITER_REQUIRE`` names ``api`` (as .ci/run sets it once it installed the tools)."""

    def check(tool: str, api: str) -> None:
        import shutil

        if shutil.which(tool) is not None:
            return
        if api in {part.strip() for part in os.environ.get("ARBITER_REQUIRE", "").split(",")}:
            pytest.fail(f"ARBITER_REQUIRE names {api} but {tool} is not installed")
        pytest.skip(f"{tool} is not installed")

    return check
