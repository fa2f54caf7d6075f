"""The lines of a followed file's bytes: split as they come (a partial line waits for its end,
one too long to be a line is dropped), and read backward from an offset, for the phase a file
already records when it is first opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

#: a line longer than this is malformed; it is dropped rather than buffered without end
MAX_LINE_BYTES = 1 << 20
#: how much one read takes at the most
CHUNK = 1 << 16
#: how much of what was read is compared again before each read, to notice a rewrite
TAIL_BYTES = 256
#: how far back a file is read for its last line end or its last phase, at most: a file
#: without a line end in its last bytes (a sparse file of terabytes of holes) is not read
#: back to its start
BACKWARD_MOST = 64 << 20


class LineSplitter:
    """Bytes in, complete lines out.  With ``splits_cr`` a carriage return ends a line too (a
    progress bar redraws one line with ``\\r``)."""

    def __init__(self, splits_cr: bool) -> None:
        self.splits_cr = splits_cr
        self._partial = b""
        self._discarding = False  # inside a line too long to keep

    def reset(self) -> None:
        """Forget the partial line: what comes next starts a line (another file, or the top)."""
        self._partial, self._discarding = b"", False

    def inside_long_line(self) -> None:
        """What comes next ends a line too long to keep (its start lies too far back to be
        read): it is dropped up to its end, as a line that grew too long is."""
        self._partial, self._discarding = b"", True

    def split(self, chunk: bytes) -> tuple[list[bytes], int]:
        """(the lines ``chunk`` completes, how many lines were dropped as too long)."""
        if self.splits_cr:
            chunk = chunk.replace(b"\r", b"\n")  # "\r\n" leaves an empty line, which is skipped
        if self._discarding:
            end = chunk.find(b"\n")
            if end < 0:
                return [], 0
            chunk, self._discarding = chunk[end + 1 :], False
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._discarding = b"", True
            return lines, 1
        return lines, 0


def end_of_last_line(fd: int, size: int, cr: bool = False) -> int:
    """The offset just past the file's last newline (or carriage return, with ``cr``; 0
    when it has none; ``size`` when none is in its last :data:`MAX_LINE_BYTES`: the last line
    is then too long to be one of ours, and what ends it is dropped with it)."""
    pos = size
    while pos > 0 and size - pos <= MAX_LINE_BYTES:
        n = min(CHUNK, pos)
        pos -= n
        block = os.pread(fd, n, pos)
        at = max(block.rfind(b"\n"), block.rfind(b"\r")) if cr else block.rfind(b"\n")
        if at >= 0:
            return pos + at + 1
    return 0 if pos <= 0 else size


def read_tail(fd: int, end: int, length: int = TAIL_BYTES) -> bytes:
    """The ``length`` bytes before ``end``."""
    start = max(0, end - length)
    return os.pread(fd, end - start, start)


def lines_backward(fd: int, end: int) -> Iterator[bytes]:
    """The complete lines before ``end``, last first, within :data:`BACKWARD_MOST` of it."""
    pos = end
    carry = b""
    while pos > 0 and end - pos < BACKWARD_MOST:
        n = min(CHUNK, pos)
        pos -= n
        lines = (os.pread(fd, n, pos) + carry).split(b"\n")
        carry = lines[0]
        yield from reversed(lines[1:])
        if len(carry) > MAX_LINE_BYTES:
            carry = b""  # a line too long to be one of ours; its start reads as malformed
    if carry and pos <= 0:
        yield carry
