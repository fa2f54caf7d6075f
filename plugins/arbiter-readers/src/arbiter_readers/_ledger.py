"""Per-process cumulative busy time built from per-client counters that come and go.

A GPU driver counts busy time per *client* (an open DRM file, a Metal user client), not per
process.  A process's busy time is the sum over the clients it holds, and that sum drops
when it closes one.  The daemon takes the difference of two readings, so a sum that drops
would read as negative work, then as a counter reset that looks fully busy.  The ledger
keeps each process's total monotonic: what a client counted while a process held it stays
with that process after the client is gone, and a client that changes hands (its holder
exited, a lower pid that shares it is now asked for) counts for the new holder only from
the moment it changed hands.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: what tells one client from another (a DRM (driver, pdev, client id), an IO registry id)
K = TypeVar("K", bound=Hashable)


@dataclass
class _Held:
    """One client as the ledger last saw it."""

    pid: int
    last: dict[str, int]  # the client's counters, never lower than an earlier sample
    base: dict[str, int] = field(default_factory=dict)  # its counters when ``pid`` took it over

    def counted(self) -> dict[str, int]:
        return {engine: max(0, value - self.base.get(engine, 0)) for engine, value in self.last.items()}


class Ledger(Generic[K]):
    """Turns per-client cumulative counters into per-process cumulative counters."""

    def __init__(self) -> None:
        self._held: dict[K, _Held] = {}
        self._retired: dict[int, dict[str, int]] = {}  # what closed clients counted, per holder

    def update(
        self,
        clients: Mapping[K, tuple[int, Mapping[str, int]]],
        keep: Collection[int],
        hold: Collection[int] = (),
    ) -> dict[int, dict[str, int]]:
        """Record one reading: ``clients`` maps a client to (its holder, its counters).

        Returns each process's cumulative counters, for the pids that hold a client now or
        once held one; pids not in ``keep`` (no longer asked about) are forgotten.  The
        clients of pids in ``hold`` (not read this time, e.g. denied) stay as they were, so
        they do not count twice when they can be read again.
        """
        keep = set(keep)
        hold = set(hold)
        held: dict[K, _Held] = {}
        for key, (pid, counters) in clients.items():
            before = self._held.pop(key, None)
            if before is not None and before.pid == pid:
                last = dict(before.last)
                for engine, value in counters.items():
                    last[engine] = max(last.get(engine, 0), value)  # a counter never goes back
                held[key] = _Held(pid, last, before.base)
                continue
            if before is not None:
                self._retire(before)
                base = {engine: max(before.last.get(engine, 0), 0) for engine in counters}
            else:
                base = {}
            held[key] = _Held(pid, dict(counters), base)
        for key, gone in self._held.items():  # clients closed since the last reading, or not read
            if gone.pid in hold:
                held[key] = gone
            else:
                self._retire(gone)
        self._held = {key: h for key, h in held.items() if h.pid in keep}
        self._retired = {pid: c for pid, c in self._retired.items() if pid in keep}

        totals: dict[int, dict[str, int]] = {pid: dict(counted) for pid, counted in self._retired.items()}
        for h in self._held.values():
            total = totals.setdefault(h.pid, {})
            for engine, value in h.counted().items():
                total[engine] = total.get(engine, 0) + value
        return totals

    def _retire(self, h: _Held) -> None:
        retired = self._retired.setdefault(h.pid, {})
        for engine, value in h.counted().items():
            retired[engine] = retired.get(engine, 0) + value
