"""``fake``: a reader whose readings a test scripts through a JSON state file.

The file (rewritten by the test whenever it wants the GPU to look different)::

    {"readable": true, "why": "", "device": "gpu",
     "vram_total_bytes": N, "vram_free_bytes": N,
     "processes": {"<pid>": {"busy_ns": {"gfx": N}, "vram_bytes": N}
                   or {"busy_share": 0.4, "vram_bytes": N}}}

``busy_ns`` is reported as given.  ``"fault"`` makes the reader misbehave, the way a broken
reader plugin would, from the next call on: ``"raise"`` raises, ``"hang"`` blocks for
``hang_s`` (default 30) seconds, and ``"not_a_reading"``, ``"nan"``, ``"negative"``, ``"huge"`` or
``"negative_vram"`` return garbage (another type, or busy times and VRAM no GPU can have).  ``busy_share`` says the process is busy that share of
wall time from now on: the reader integrates it into a cumulative ``gfx`` busy time, so a
test changes a process's load by rewriting the file, without tracking time itself.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from arbiter.plugin import GpuReading, KindOptions, PluginContext, ProcessGpu, Reader

ENGINE = "gfx"
GARBAGE_VRAM = 1 << 30


class FakeOptions(KindOptions):
    kind: Literal["fake"] = "fake"
    state_file: str
    #: a fake CUDA driver's folder (:mod:`arbiter_testing.fake_cuda`): a process it holds
    #: checkpointed holds no VRAM, as the real driver releases it
    cuda_dir: str | None = None


@dataclass
class _Track:
    """One pid's integrated busy time."""

    share: float | None  # None while the file gives busy_ns itself
    busy_ns: float
    at_ns: int  # monotonic time busy_ns was integrated up to


@dataclass(frozen=True)
class _Entry:
    busy_ns: Mapping[str, int] | None
    busy_share: float | None
    vram_bytes: int | None


class FakeReader(Reader):
    """Reads what the state file says; integrates ``busy_share`` across calls."""

    Options = FakeOptions

    def __init__(self, options: FakeOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._path = os.path.expanduser(options.state_file)
        # The daemon may read from more than one worker thread.
        self._lock = threading.Lock()
        self._tracks: dict[int, _Track] = {}

    def read(self, pids: Collection[int]) -> GpuReading:
        with self._lock:
            return self._read(pids)

    def _read(self, pids: Collection[int]) -> GpuReading:
        now_ns = time.monotonic_ns()
        try:
            with open(self._path, "rb") as fh:
                mtime_ns = os.fstat(fh.fileno()).st_mtime_ns
                raw = fh.read()
            age_ns = time.time_ns() - mtime_ns
            doc = json.loads(raw)
            entries = _parse(doc)
        except FileNotFoundError:
            return self._unreadable(now_ns, f"fake reader state file {self._path} does not exist (the test writes it)")
        except OSError as exc:
            return self._unreadable(
                now_ns, f"fake reader state file {self._path} cannot be read: {exc.strerror or exc}"
            )
        except ValueError as exc:
            return self._unreadable(now_ns, f"fake reader state file {self._path} is not valid: {exc}")

        fault = doc.get("fault") if isinstance(doc, dict) else None
        if fault:
            return self._misbehave(str(fault), doc, pids, now_ns)  # type: ignore[no-any-return]

        # The file's modification time, on the monotonic clock: when a new share began.
        written_ns = now_ns - max(0, age_ns)
        for pid, given in entries.items():
            self._integrate(pid, given, now_ns, written_ns)

        if not doc.get("readable", True):
            why = str(doc.get("why") or "the fake reader's state file says the GPU is unreadable")
            return self._unreadable(now_ns, why, device=str(doc.get("device", "gpu")))
        released = self._checkpointed(entries)
        processes: dict[int, ProcessGpu] = {}
        for pid in pids:
            entry = entries.get(pid)
            if entry is None:
                continue
            if pid in released:
                entry = _Entry(entry.busy_ns, entry.busy_share, 0)
            if entry.busy_ns is not None:
                busy = dict(entry.busy_ns)
            else:
                busy = {ENGINE: round(self._tracks[pid].busy_ns)}
            processes[pid] = ProcessGpu(busy_ns=busy, vram_bytes=entry.vram_bytes)
        return GpuReading(
            readable=True,
            at_ns=now_ns,
            processes=processes,
            device=str(doc.get("device", "gpu")),
            vram_total_bytes=_opt_int(doc, "vram_total_bytes"),
            vram_free_bytes=_free(doc, sum(entries[pid].vram_bytes or 0 for pid in released)),
            why=str(doc.get("why") or ""),
        )

    def _checkpointed(self, entries: Mapping[int, _Entry]) -> set[int]:
        folder = self.options.cuda_dir  # type: ignore[attr-defined]
        if not folder:
            return set()
        out = set()
        for pid in entries:
            try:
                with open(os.path.join(folder, str(pid))) as fh:
                    if fh.read().strip() == "checkpointed":
                        out.add(pid)
            except OSError:
                continue
        return out

    def _integrate(self, pid: int, entry: _Entry, now_ns: int, written_ns: int) -> None:
        track = self._tracks.get(pid)
        if entry.busy_share is None:
            # Given outright; a later switch to busy_share carries on from this value.
            base = entry.busy_ns.get(ENGINE, 0) if entry.busy_ns else 0
            self._tracks[pid] = _Track(share=None, busy_ns=float(base), at_ns=now_ns)
            return
        share = entry.busy_share
        if track is None:
            self._tracks[pid] = _Track(share=share, busy_ns=0.0, at_ns=now_ns)
            return
        old = track.share if track.share is not None else share
        if old != share and track.at_ns < written_ns < now_ns:
            # The share changed between two reads: the old one held until the file was written.
            track.busy_ns += old * (written_ns - track.at_ns) + share * (now_ns - written_ns)
        else:
            track.busy_ns += share * (now_ns - track.at_ns)
        track.share = share
        track.at_ns = now_ns

    def _misbehave(self, fault: str, doc: Mapping[str, Any], pids: Collection[int], now_ns: int) -> Any:
        if fault == "raise":
            raise RuntimeError("the fake reader was told to fail (fault: raise in its state file)")
        if fault == "hang":
            time.sleep(float(doc.get("hang_s", 30)))
            return self._unreadable(time.monotonic_ns(), "the fake reader hung (fault: hang)")
        if fault == "not_a_reading":
            return {"readable": True, "processes": {}}
        busy: Any = {"nan": float("nan"), "negative": -(10**9), "huge": 10**30}.get(fault)
        if busy is None and fault != "negative_vram":
            raise ValueError(f"fake reader: unknown fault {fault!r} in its state file")
        processes = {
            pid: ProcessGpu(
                busy_ns={ENGINE: busy if busy is not None else 0}, vram_bytes=-GARBAGE_VRAM if busy is None else 0
            )
            for pid in pids
        }
        return GpuReading(
            readable=True,
            at_ns=now_ns,
            processes=processes,
            vram_total_bytes=16 * GARBAGE_VRAM,
            vram_free_bytes=-GARBAGE_VRAM if busy is None else GARBAGE_VRAM,
        )

    @staticmethod
    def _unreadable(at_ns: int, why: str, device: str = "gpu") -> GpuReading:
        return GpuReading(readable=False, at_ns=at_ns, device=device, why=why)


def _parse(doc: Any) -> dict[int, _Entry]:
    """The file's processes; ValueError names what is wrong, for the test author."""
    if not isinstance(doc, dict):
        raise ValueError("the top level must be a JSON object")
    procs = doc.get("processes", {})
    if not isinstance(procs, dict):
        raise ValueError('"processes" must be an object of pid → entry')
    for key in ("vram_total_bytes", "vram_free_bytes"):
        _opt_int(doc, key)
    entries: dict[int, _Entry] = {}
    for key, value in procs.items():
        try:
            pid = int(key)
        except ValueError:
            raise ValueError(f"process key {key!r} is not a pid") from None
        if not isinstance(value, dict):
            raise ValueError(f"process {key}: the entry must be an object")
        unknown = set(value) - {"busy_ns", "busy_share", "vram_bytes"}
        if unknown:
            raise ValueError(f"process {key}: unknown field(s) {', '.join(sorted(unknown))}")
        busy_ns = value.get("busy_ns")
        share = value.get("busy_share")
        if (busy_ns is None) == (share is None):
            raise ValueError(f"process {key}: give exactly one of busy_ns and busy_share")
        if busy_ns is not None and (
            not isinstance(busy_ns, dict)
            or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in busy_ns.items()
            )
        ):
            raise ValueError(f"process {key}: busy_ns must map engine names to integer nanoseconds")
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
                raise ValueError(f"process {key}: busy_share must be a number from 0 to 1, not {share!r}")
            share = float(share)
        entries[pid] = _Entry(busy_ns=busy_ns, busy_share=share, vram_bytes=_opt_int(value, "vram_bytes", key))
    return entries


def _free(doc: Mapping[str, Any], released: int) -> int | None:
    free = _opt_int(doc, "vram_free_bytes")
    return None if free is None else free + released


def _opt_int(obj: Mapping[str, Any], key: str, where: str | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        prefix = f"process {where}: " if where else ""
        raise ValueError(f"{prefix}{key} must be an integer number of bytes, not {value!r}")
    return value


def write_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write a state file atomically, so a reader never sees half of it (a test helper)."""
    target = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".fake-", dir=os.path.dirname(os.path.abspath(target)))
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
