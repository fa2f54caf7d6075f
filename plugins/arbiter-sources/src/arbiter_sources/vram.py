"""``vram``: a busy probe that says a tenant is working while it holds more VRAM than a level.

The daemon reads VRAM through its readers and hands the tenant's total to the source on
every tick (:meth:`arbiter.plugin.Source.tenant_vram`); a source reads no GPU itself.  VRAM
the readers cannot read leaves the state unknown, which counts as busy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from arbiter.plugin import KindOptions, PluginContext, Source, SourceState

GIB = 1 << 30  # "GB" in rule files means GiB, as GPU tools show VRAM


class VramOptions(KindOptions):
    """``{kind: vram, above_gb: N}``: busy while the tenant holds more than N GB."""

    def gives_phase(self) -> bool:
        return False

    kind: Literal["vram"] = "vram"
    above_gb: float = Field(ge=0, description="busy while the tenant's processes hold more VRAM than this (GB = GiB)")


class VramSource(Source):
    """Judged on the tick, from the VRAM the daemon hands over; ``on_change`` is never called
    (the tick reads ``state()`` right after handing the VRAM over)."""

    Options = VramOptions
    uses_vram = True

    def __init__(
        self, options: VramOptions, context: PluginContext, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(options, context)
        self.options: VramOptions = options
        self._clock = clock
        self._level = round(options.above_gb * GIB)
        self._lock = threading.Lock()
        self._state = SourceState(readable=False, why="no VRAM reading yet (handed over on the tick)")

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        pass

    def state(self) -> SourceState:
        return self._state

    def tenant_vram(self, held_bytes: int | None) -> None:
        level = f"{self.options.above_gb:g} GB"
        if held_bytes is None:
            state = SourceState(
                readable=False,
                busy=None,
                why="the readers cannot read its VRAM, so its state is unknown (counts as busy)",
            )
        else:
            busy = held_bytes > self._level
            state = SourceState(
                readable=True,
                busy=busy,
                why=f"holds {held_bytes / GIB:.2f} GB, {'above' if busy else 'not above'} {level}",
            )
        with self._lock:
            prev = self._state
            moved = (state.readable, state.busy) != (prev.readable, prev.busy)
            self._state = SourceState(
                readable=state.readable,
                busy=state.busy,
                why=state.why,
                changed_at=self._clock() if moved else prev.changed_at,
            )
