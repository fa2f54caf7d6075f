"""What a followed file's lines mean: the subclass's part (which lines match, what phase and
how much progress each gives), and the tally of them the followed file keeps.
"""

from __future__ import annotations

from arbiter.plugin import Phase
from arbiter_sources.follow_lines import LineSplitter, lines_backward

#: what a line says: None when it is malformed, else (does it match, the phase it sets)
LineMeaning = tuple[bool, Phase | None] | None


class LineTally:
    """The progress, phase and malformed lines counted so far; subclasses say what a line means."""

    #: lines that did not parse (or were too long), skipped
    malformed: int
    _count: int
    _phase: Phase | None
    _lines: LineSplitter
    _history_needles: tuple[bytes, ...]

    def match_line(self, line: bytes) -> LineMeaning:
        """What one complete, stripped, non-empty line means."""
        raise NotImplementedError

    def units(self) -> int:
        """How much progress the line ``match_line`` just matched is worth (one, unless the
        line carries its own count)."""
        return 1

    def count_lines(self, lines: list[bytes]) -> tuple[int, int] | None:
        """For a source that gives no phase, where the lines' order does not matter: (the
        progress these complete lines add, how many of them are malformed), worked out in
        one go, exactly as matching each in turn would; None to have each matched in turn."""
        return None

    def _feed(self, chunk: bytes) -> None:
        lines, dropped = self._lines.split(chunk)
        self.malformed += dropped
        if self._phase is None and (counted := self.count_lines(lines)) is not None:
            units, malformed = counted
            self._count += units
            self.malformed += malformed
            return
        for line in lines:
            self._apply(line)

    def _apply(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        meaning = self.match_line(line)
        if meaning is None:
            self.malformed += 1
            return
        matched, phase = meaning
        if matched:
            self._count += self.units()
            if phase is not None:
                self._phase = phase

    def _last_phase(self, fd: int, end: int) -> Phase | None:
        for line in lines_backward(fd, end):
            if self._history_needles and not any(n in line for n in self._history_needles):
                continue
            meaning = self.match_line(line.strip())
            if meaning is not None and meaning[0] and meaning[1] is not None:
                return meaning[1]
        return None
