"""What the status page's charts share: the palette, escaping, the clock a time axis is
labelled in, and :class:`Frame`, which places a time and a value from 0 to 1 in an inline
SVG and draws the grid, the value labels and the time labels around them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html import escape
from typing import Any

PALETTE = ("#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4")
MUTED = "#656d76"
GRID = "#eaeef2"


def esc(value: Any) -> str:
    """Text for HTML or an SVG attribute (None is empty)."""
    return escape("" if value is None else str(value), quote=True)


def clock(t: float | None) -> str:
    """A time as the local wall clock's ``HH:MM:SS`` (None: ``-``)."""
    if t is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t))


@dataclass(frozen=True)
class Frame:
    """A chart of ``width`` × ``height`` pixels whose plot leaves the given margins; time runs
    from ``t0`` over ``span`` seconds, values from 0 (bottom) to 1 (top), clamped."""

    t0: float
    span: float
    width: int = 720
    height: int = 220
    left: int = 44
    right: int = 16
    top: int = 12
    bottom: int = 28

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> int:
        return self.height - self.top - self.bottom

    def x(self, t: float) -> float:
        return round(self.left + self.plot_w * (max(t, self.t0) - self.t0) / self.span, 1)

    def y(self, v: float) -> float:
        return round(self.top + self.plot_h * (1 - min(max(v, 0.0), 1.0)), 1)

    def open(self, cls: str, label: str) -> str:
        """The ``<svg>`` start tag, its class ``cls`` and its accessible name ``label``."""
        return (
            f"<svg xmlns='http://www.w3.org/2000/svg' class='{cls}' viewBox='0 0 {self.width} {self.height}' "
            f"width='{self.width}' height='{self.height}' role='img' aria-label='{esc(label)}'>"
        )

    def grid(self, values: Iterable[float], label: Callable[[float], str]) -> list[str]:
        """A line across the plot at each value, labelled on the left."""
        return [
            f"<line x1='{self.left}' x2='{self.width - self.right}' y1='{self.y(v)}' y2='{self.y(v)}' stroke='{GRID}'/>"
            f"<text x='{self.left - 6}' y='{self.y(v) + 4}' text-anchor='end' font-size='11' fill='{MUTED}'>"
            f"{esc(label(v))}</text>"
            for v in values
        ]

    def time_label(self, t: float, text: str, anchor: str) -> str:
        """``text`` under the plot at time ``t`` (``anchor``: start, middle or end)."""
        return (
            f"<text x='{self.x(t)}' y='{self.height - 8}' text-anchor='{anchor}' font-size='11' fill='{MUTED}'>"
            f"{esc(text)}</text>"
        )
