"""``log``: progress from a plain-text log.

Each line ``log_regex`` finds counts as one unit of progress; a line ends at a newline or at
a carriage return, so a progress bar that redraws one line (tqdm, and most Python training
loops) gives one line per redraw.  Where the regex has a named group ``count`` (as in
``(?P<count>\\d+)/(?P<total>\\d+)``), the line carries its own count instead: progress is
what that count gained since the line before, and a count that goes back (a new bar, the
next epoch) starts over from zero.  tqdm's scaled counts (``1.21k``, ``3.4M``) are read too.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from arbiter.plugin import PluginContext
from arbiter_sources.follow import FollowedFile, LineMeaning
from arbiter_sources.follow_path import FollowOptions

#: the SI prefixes tqdm's ``unit_scale`` writes after a count (``format_sizeof``: powers of 1000)
_SCALE = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Z": 10**21, "Y": 10**24}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kMGTPEZY]?)\s*$")


def parse_count(text: str) -> int | None:
    """``"370"`` → 370, ``"1.21k"`` → 1210; None when it is not such a count."""
    m = _NUMBER.match(text)
    if m is None:
        return None
    return round(float(m.group(1)) * _SCALE[m.group(2)])


class LogOptions(FollowOptions):
    """``{kind: log, path, log_regex}``: a rate of matching lines, or of the count they carry."""

    kind: Literal["log"] = "log"
    log_regex: str = Field(
        description=(
            "a Python regular expression; each line it matches counts as one unit of progress, or, with a "
            "named group count (e.g. (?P<count>\\d+)/(?P<total>\\d+) for tqdm), as what that count gained"
        )
    )

    @field_validator("log_regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        if not value:
            raise ValueError("log_regex is empty: it would match every line; write the pattern of a progress line")
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"log_regex is not a regular expression: {exc}") from None
        except (OverflowError, RecursionError) as exc:  # a{99999999999}, or groups nested thousands deep
            raise ValueError(f"log_regex is too large to compile: {exc}") from None
        named = set(compiled.groupindex)
        near = [g for g in named if g != "count" and g.lower() in ("n", "cnt", "done", "counts", "step", "steps")]
        if near and "count" not in named:
            raise ValueError(
                f"log_regex names a group {near[0]!r}: did you mean (?P<count>...)? only a group named count "
                "is read as the line's own count"
            )
        return value


class LogSource(FollowedFile):
    """Follows a log file (or the newest file a glob matches); each line the regex finds counts."""

    kind = "log"
    Options = LogOptions
    splits_cr = True

    def __init__(self, options: LogOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: LogOptions = options
        self._regex = re.compile(options.log_regex)
        self._carries_count = "count" in self._regex.groupindex
        self._last: int | None = None  # the count the last matching line carried
        self._gain = 1

    def match_line(self, line: bytes) -> LineMeaning:
        found = self._regex.search(line.decode("utf-8", "replace"))
        if found is None:
            return False, None
        if not self._carries_count:
            return True, None
        text = found.group("count")
        count = None if text is None else parse_count(text)
        if count is None:
            return None  # malformed: the group matched something that is not a count
        if self._last is None:
            self._gain = 0  # the first count read is where progress is measured from
        elif count >= self._last:
            self._gain = count - self._last
        else:
            self._gain = count  # it went back: a new bar, counting from zero
        self._last = count
        return True, None

    def units(self) -> int:
        return self._gain
