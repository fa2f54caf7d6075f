"""``drm_fdinfo``: the per-client GPU usage Linux DRM drivers publish in ``/proc/PID/fdinfo``.

Every open DRM file is a *client*; drivers that support it (i915, xe, amdgpu since 5.19,
msm, panfrost, panthor, v3d, ...) print its usage in the fdinfo of each fd that refers to
it, in the ``drm-`` keys of the kernel's ``Documentation/gpu/drm-usage-stats.rst``:

- ``drm-engine-<engine>: N ns``: cumulative busy time on an engine, for an engine group
  divided by ``drm-engine-capacity-<engine>``;
- ``drm-cycles-<engine>`` with ``drm-total-cycles-<engine>`` (xe prints no ns): the share of
  the engine's cycles the client used, which the reader turns into a cumulative busy time
  by integrating it over wall time between readings;
- ``drm-resident-<region>`` (memory regions such as ``vram0``) or the older
  ``drm-memory-vram``: the client's memory, with a unit (KiB, MiB, ...).

A client shows up once per fd that refers to it, and a forked child holds its parent's;
clients are told apart by ``(drm-pdev, drm-client-id)`` and each is counted once, for the
lowest pid asked about that holds it.  The text parsing is in pure functions, so tests run
on captured fdinfo without a GPU.

It runs past 400 lines because the drivers' differences in one format (engine names, memory
regions, capacities, cycle counters) are read in one place.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from arbiter.plugin import GpuReading, KindOptions, PluginContext, ProcessGpu, Reader
from arbiter_readers._ledger import Ledger

DRIVER_KEY = "drm-driver"
#: memory regions that are the device's own memory (xe ``vram0``, amdgpu ``vram``, i915 ``local0``)
VRAM_REGIONS = ("vram", "local")
UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

NO_DEVICE_WHY = "no DRM client in /proc/*/fdinfo: no GPU driver exposes per-client usage here (no device in /dev/dri)"
NO_CLIENT_WHY = (
    "no DRM client in /proc/*/fdinfo: no GPU driver exposes per-client usage here "
    "(or none in a process this account may read)"
)
LEGACY_WHY = (
    "the GPU driver's fdinfo has no per-client drm- keys (amdgpu before Linux 5.19 prints only "
    "percentages): per-process GPU busy time cannot be read"
)
#: how long a host scan that found no DRM client stands before the next one
RESCAN_NS = 30_000_000_000

_CARD = re.compile(r"card\d+")

ClientKey = tuple[str, str, str]


# --- parsing (pure) ---------------------------------------------------------------------------


def parse_fdinfo(text: str) -> dict[str, str]:
    """``key: value`` lines into a dict; keys and values stripped (drivers pad with tabs or spaces)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def parse_size(value: str) -> int | None:
    """``"23992 KiB"`` → bytes; a bare number is bytes; None for what is not a size."""
    parts = value.split()
    if not parts or len(parts) > 2:
        return None
    try:
        number = int(parts[0])
    except ValueError:
        return None
    unit = UNITS.get(parts[1] if len(parts) == 2 else "")
    return None if unit is None else number * unit


def _leading_int(value: str) -> int | None:
    """The number in ``"9288864723 ns"`` or ``"2"``."""
    parts = value.split()
    try:
        return int(parts[0]) if parts else None
    except ValueError:
        return None


def fdinfo_format(fields: Mapping[str, str]) -> Literal["drm", "legacy"] | None:
    """``drm`` for a client with ``drm-`` keys; ``legacy`` for the amdgpu 5.14–5.18 format
    (``pdev:``, ``pasid:``, ``gfx0: 70.59%``), which says nothing cumulative; None otherwise."""
    if DRIVER_KEY in fields:
        return "drm"
    if "pdev" in fields and "pasid" in fields:
        return "legacy"
    return None


@dataclass(frozen=True)
class CyclesSample:
    """One client's ``drm-cycles-<engine>`` and ``drm-total-cycles-<engine>`` at one moment."""

    cycles: int
    total_cycles: int
    capacity: int = 1


def cycles_share(before: CyclesSample, after: CyclesSample) -> float | None:
    """The share of the engine (group) the client kept busy between two samples, 0..1.

    None when nothing can be said: the engine's total did not advance, or a counter went
    backwards (the client was reset).
    """
    d_cycles = after.cycles - before.cycles
    d_total = after.total_cycles - before.total_cycles
    if d_cycles < 0 or d_total <= 0:
        return None
    return min(1.0, d_cycles / (d_total * max(1, after.capacity)))


@dataclass(frozen=True)
class DrmClient:
    """What one fdinfo says about its DRM client."""

    driver: str
    pdev: str
    client_id: str
    #: cumulative busy ns per engine, already divided by the engine's capacity
    engines_ns: Mapping[str, int] = field(default_factory=dict)
    #: engines that count cycles instead of ns (only those without an ns counter)
    cycles: Mapping[str, CyclesSample] = field(default_factory=dict)
    vram_bytes: int | None = None

    @property
    def key(self) -> ClientKey:
        return (self.driver, self.pdev, self.client_id)


def parse_client(text: str) -> DrmClient | None:
    """The DRM client an fdinfo text describes, or None when it has no ``drm-driver`` key
    (not a DRM fd, or a driver that prints no per-client ``drm-`` keys)."""
    fields = parse_fdinfo(text)
    if fdinfo_format(fields) != "drm":
        return None
    capacity: dict[str, int] = {}
    raw_ns: dict[str, int] = {}
    cycles: dict[str, int] = {}
    totals: dict[str, int] = {}
    resident_vram: int | None = None
    for key, value in fields.items():
        if key.startswith("drm-engine-capacity-"):
            number = _leading_int(value)
            if number is not None and number > 0:
                capacity[key.removeprefix("drm-engine-capacity-")] = number
        elif key.startswith("drm-engine-"):
            number = _leading_int(value)
            if number is not None:
                raw_ns[key.removeprefix("drm-engine-")] = number
        elif key.startswith("drm-total-cycles-"):
            number = _leading_int(value)
            if number is not None:
                totals[key.removeprefix("drm-total-cycles-")] = number
        elif key.startswith("drm-cycles-"):
            number = _leading_int(value)
            if number is not None:
                cycles[key.removeprefix("drm-cycles-")] = number
        elif key.startswith("drm-resident-") and key.removeprefix("drm-resident-").startswith(VRAM_REGIONS):
            size = parse_size(value)
            if size is not None:
                resident_vram = (resident_vram or 0) + size
    vram = resident_vram
    if vram is None and "drm-memory-vram" in fields:
        vram = parse_size(fields["drm-memory-vram"])
    engines_ns = {engine: ns // capacity.get(engine, 1) for engine, ns in raw_ns.items()}
    # msm and panfrost print drm-cycles beside their ns counter but no total: only engines
    # with both cycle keys and no ns counter are measured in cycles.
    cycle_engines = {
        engine: CyclesSample(cycles[engine], totals[engine], capacity.get(engine, 1))
        for engine in cycles.keys() & totals.keys()
        if engine not in engines_ns
    }
    return DrmClient(
        driver=fields[DRIVER_KEY],
        pdev=fields.get("drm-pdev", ""),
        client_id=fields.get("drm-client-id", ""),
        engines_ns=engines_ns,
        cycles=cycle_engines,
        vram_bytes=vram,
    )


def device_vram(total_text: str, used_text: str) -> tuple[int, int] | None:
    """(total, free) bytes from amdgpu's ``mem_info_vram_total`` and ``mem_info_vram_used``."""
    try:
        total, used = int(total_text.strip()), int(used_text.strip())
    except ValueError:
        return None
    return total, max(0, total - used)


# --- the reader ---------------------------------------------------------------------------


class DrmFdinfoOptions(KindOptions):
    kind: Literal["drm_fdinfo"] = "drm_fdinfo"


@dataclass(frozen=True)
class _CyclesTrack:
    """A cycles engine's last sample and the busy ns integrated up to it."""

    sample: CyclesSample
    at_ns: int
    busy_ns: float


class DrmFdinfoReader(Reader):
    """Reads each asked process's DRM clients from ``/proc/PID/fdinfo``.

    The roots are parameters so tests can point the reader at a tree they build; the daemon
    constructs it with the defaults.
    """

    preference = 20

    Options = DrmFdinfoOptions

    def __init__(
        self,
        options: DrmFdinfoOptions,
        context: PluginContext,
        *,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        dev_root: Path = Path("/dev"),
    ) -> None:
        super().__init__(options, context)
        self.proc_root = proc_root
        self.sys_root = sys_root
        self.dev_root = dev_root
        self._lock = threading.Lock()  # the daemon may read from more than one worker thread
        self._ledger: Ledger[ClientKey] = Ledger()
        self._cycles: dict[ClientKey, dict[str, _CyclesTrack]] = {}
        self._host_has_clients = False
        self._host_scanned_at: int | None = None
        self._host_legacy = False

    def read(self, pids: Collection[int]) -> GpuReading:
        with self._lock:
            return self._read(pids)

    def _read(self, pids: Collection[int]) -> GpuReading:
        at_ns = time.monotonic_ns()
        asked = sorted(set(pids))
        found: dict[ClientKey, tuple[int, DrmClient]] = {}
        unreadable: set[int] = set()
        legacy = False
        for pid in asked:  # ascending: a shared client counts for the lowest pid
            try:
                texts = list(self._fdinfo_texts(pid))
            except PermissionError:
                unreadable.add(pid)
                continue
            except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
                continue  # exited: it uses no GPU
            except OSError:
                unreadable.add(pid)
                continue
            for fd, text in texts:
                client = parse_client(text)
                if client is None:
                    legacy = legacy or fdinfo_format(parse_fdinfo(text)) == "legacy"
                    continue
                # drm-client-id is printed by every driver with drm- keys; without one the fd
                # is the best identity there is
                key = client.key if client.client_id else (client.driver, client.pdev, f"{pid}/{fd}")
                found.setdefault(key, (pid, client))

        counters = {key: (pid, self._busy(key, client, at_ns)) for key, (pid, client) in found.items()}
        self._cycles = {key: tracks for key, tracks in self._cycles.items() if key in found}
        totals = self._ledger.update(counters, keep=asked, hold=unreadable)
        vram: dict[int, int | None] = {}
        for pid, client in found.values():
            if client.vram_bytes is not None:
                vram[pid] = (vram.get(pid) or 0) + client.vram_bytes
            else:
                vram.setdefault(pid, None)  # a client without memory keys: unknown, unless another tells
        # a pid in ``totals`` without a client now has closed them all: it holds no memory, and
        # stays listed so its busy time never seems to restart from zero
        processes = {
            pid: ProcessGpu(busy_ns=totals.get(pid, {}), vram_bytes=vram.get(pid, 0))
            for pid in sorted((set(vram) | set(totals)) - unreadable)
        }
        total, free = self._device_vram()
        devices = self._device_names()

        if found:
            self._host_has_clients = True
            readable, why = True, ""
        elif legacy:
            readable, why = False, LEGACY_WHY
        elif self._host_has_clients or self._scan_host(at_ns):
            readable, why = True, "none of these processes holds a DRM client"
        elif self._host_legacy:
            readable, why = False, LEGACY_WHY
        elif not self._has_drm_device():
            readable, why = False, NO_DEVICE_WHY
        else:
            readable, why = False, NO_CLIENT_WHY
        if not readable:
            processes = {}
        return GpuReading(
            readable=readable,
            at_ns=at_ns,
            processes=processes,
            device="gpu",
            vram_total_bytes=total,
            vram_free_bytes=free,
            why=why,
            unreadable=frozenset(unreadable),
            devices=devices,
        )

    def _busy(self, key: ClientKey, client: DrmClient, at_ns: int) -> dict[str, int]:
        """The client's cumulative busy ns per engine; cycle counters integrated over wall time."""
        busy = dict(client.engines_ns)
        before = self._cycles.get(key, {})
        tracks: dict[str, _CyclesTrack] = {}
        for engine, sample in client.cycles.items():
            track = before.get(engine)
            if track is None:
                tracks[engine] = _CyclesTrack(sample, at_ns, 0.0)  # the first sample: a baseline
            else:
                share = cycles_share(track.sample, sample)
                if share is not None:
                    tracks[engine] = _CyclesTrack(sample, at_ns, track.busy_ns + share * (at_ns - track.at_ns))
                elif sample.total_cycles == track.sample.total_cycles and sample.cycles >= track.sample.cycles:
                    tracks[engine] = track  # the engine's clock did not move: wait for it
                else:
                    tracks[engine] = _CyclesTrack(sample, at_ns, track.busy_ns)  # went back: new baseline
            busy[engine] = round(tracks[engine].busy_ns)
        self._cycles[key] = tracks
        return busy

    def _fdinfo_texts(self, pid: int) -> Iterator[tuple[str, str]]:
        """(fd, text) for each of ``pid``'s fds whose fdinfo may describe a GPU client."""
        folder = self.proc_root / str(pid) / "fdinfo"
        for fd in os.listdir(folder):
            try:
                data = (folder / fd).read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue  # closed while we looked
            if b"drm-driver" in data or b"pdev:" in data:
                yield fd, data.decode("utf-8", "replace")

    def _scan_host(self, at_ns: int) -> bool:
        """Whether any process this account may read holds a DRM client (checked at most every
        ``RESCAN_NS``): then the driver exposes usage and the asked processes simply use none."""
        if self._host_scanned_at is not None and at_ns - self._host_scanned_at < RESCAN_NS:
            return False
        self._host_scanned_at = at_ns
        if not self._has_drm_device():
            return False
        try:
            entries = [e for e in os.listdir(self.proc_root) if e.isdigit()]
        except OSError:
            return False
        for entry in entries:
            try:
                for _, text in self._fdinfo_texts(int(entry)):
                    format_ = fdinfo_format(parse_fdinfo(text))
                    if format_ == "drm":
                        self._host_has_clients = True
                        return True
                    self._host_legacy = self._host_legacy or format_ == "legacy"
            except OSError:
                continue
        return False

    def _has_drm_device(self) -> bool:
        try:
            return any(os.scandir(self.dev_root / "dri"))
        except OSError:
            return False

    def _device_names(self) -> tuple[str, ...]:
        """Each DRM card as "<driver> <vendor>:<device>" (PCI ids from sysfs), for fingerprints."""
        names = set()
        try:
            cards = os.listdir(self.sys_root / "class" / "drm")
        except OSError:
            return ()
        for card in cards:
            if not _CARD.fullmatch(card):
                continue
            device = self.sys_root / "class" / "drm" / card / "device"
            try:
                driver = os.path.basename(os.path.realpath(device / "driver"))
                ids = ":".join((device / f).read_text().strip().removeprefix("0x") for f in ("vendor", "device"))
            except OSError:
                continue
            names.add(f"{driver} {ids}")
        return tuple(sorted(names))

    def _device_vram(self) -> tuple[int | None, int | None]:
        """Total and free VRAM over the cards that publish them (amdgpu), else (None, None)."""
        total = free = 0
        seen: set[str] = set()
        try:
            cards = sorted(os.listdir(self.sys_root / "class" / "drm"))
        except OSError:
            return None, None
        for card in cards:
            if not _CARD.fullmatch(card):
                continue
            device = self.sys_root / "class" / "drm" / card / "device"
            try:
                real = os.path.realpath(device)
                pair = device_vram(
                    (device / "mem_info_vram_total").read_text(), (device / "mem_info_vram_used").read_text()
                )
            except OSError:
                continue
            if pair is None or real in seen:
                continue
            seen.add(real)
            total += pair[0]
            free += pair[1]
        return (total, free) if seen else (None, None)
