"""``log``: progress from a plain-text log, counting the lines a regular expression matches."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from arbiter.plugin import PluginContext
from arbiter_sources.follow import FollowedFile, FollowOptions, LineMeaning


class LogOptions(FollowOptions):
    """``{kind: log, path, log_regex}``: a rate of matching lines."""

    kind: Literal["log"] = "log"
    log_regex: str = Field(
        description="a Python regular expression; each line it matches counts as one unit of progress"
    )

    @field_validator("log_regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if not value:
            raise ValueError("log_regex is empty: it would match every line; write the pattern of a progress line")
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"log_regex is not a regular expression: {exc}") from None
        except (OverflowError, RecursionError) as exc:  # a{99999999999}, or groups nested thousands deep
            raise ValueError(f"log_regex is too large to compile: {exc}") from None
        return value


class LogSource(FollowedFile):
    """Follows a log file (or the newest file a glob matches); each line the regex finds counts."""

    kind = "log"
    Options = LogOptions

    def __init__(self, options: LogOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: LogOptions = options
        self._regex = re.compile(options.log_regex)

    def match_line(self, line: bytes) -> LineMeaning:
        return self._regex.search(line.decode("utf-8", "replace")) is not None, None
