"""Configuration problems that say where (file, line, column, field) and what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


def did_you_mean(name: str, known: Iterable[str], what: str = "known") -> str:
    """A hint for a name that is not one of ``known``: the closest, then the whole list."""
    names = sorted(set(known))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return hint + (f"{what}: {', '.join(names)}" if names else f"{what}: none installed")


@dataclass(frozen=True)
class Problem:
    file: str
    line: int  # 1-based; 0 when unknown
    column: int  # 1-based; 0 when unknown
    field: str  # dotted path, "" for the whole file
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.column}"
        text = f"{where}: {self.field + ': ' if self.field else ''}{self.message}"
        return f"{text} ({self.hint})" if self.hint else text

    def to_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "message": self.message,
            "hint": self.hint,
        }


class ConfigError(Exception):
    """One or more problems in a configuration file."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
