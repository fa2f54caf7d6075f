"""Configuration problems that say where (file, line, column, field) and what to do."""

from __future__ import annotations

from dataclasses import dataclass


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
