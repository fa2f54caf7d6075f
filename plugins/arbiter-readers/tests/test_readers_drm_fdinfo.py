"""The ``drm_fdinfo`` reader: parsing real fdinfo captures of each driver, and reads of a
``/proc`` tree the test builds from them (no GPU here)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from pydantic import ValidationError

from arbiter.plugin import PluginContext
from arbiter_readers.drm_fdinfo import (
    LEGACY_WHY,
    NO_CLIENT_WHY,
    NO_DEVICE_WHY,
    CyclesSample,
    DrmFdinfoReader,
    cycles_share,
    fdinfo_format,
    parse_client,
    parse_fdinfo,
    parse_size,
)

FIXTURES = Path(__file__).parent / "fixtures" / "drm-fdinfo"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
NOT_DRM = "pos:\t0\nflags:\t02\nmnt_id:\t25\nino:\t1234\n"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def edit(text: str, key: str, value: str) -> str:
    """``text`` with ``key``'s value replaced (keeping the key's own padding)."""
    new, n = re.subn(rf"^({re.escape(key)}:\s*)\S.*$", lambda m: m.group(1) + value, text, flags=re.MULTILINE)
    assert n == 1, f"{key} not in the fixture"
    return new


# --- parsing ------------------------------------------------------------------------------------


def test_parse_fdinfo_takes_tabs_and_spaces() -> None:
    msm = parse_fdinfo(fixture("msm-glmark2-patch-example.txt"))
    assert "\t" in fixture("msm-glmark2-patch-example.txt")
    assert msm["drm-driver"] == "msm" and msm["drm-engine-gpu"] == "1734371319 ns"
    assert parse_fdinfo("  drm-driver:    amdxdna\nno colon here\n: no key\n") == {"drm-driver": "amdxdna"}


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("0", 0),
        ("44564 KiB", 44564 * KiB),
        ("16 MiB", 16 * MiB),
        ("2 GiB", 2 * GiB),
        ("512 B", 512),
        ("17196 kB", None),
        ("70.59%", None),
        ("", None),
        ("1 2 KiB", None),
    ],
)
def test_sizes_with_units(value: str, size: int | None) -> None:
    assert parse_size(value) == size


def test_i915_engines_and_capacity() -> None:
    client = parse_client(fixture("i915-kernel-doc-example.txt"))
    assert client is not None
    assert client.key == ("i915", "0000:00:02.0", "7")
    assert client.engines_ns == {"render": 9288864723, "copy": 2035071108, "video": 0, "video-enhance": 0}
    assert client.cycles == {} and client.vram_bytes is None
    # the video group has two engines: its busy time is per engine of the group
    busy = parse_client(edit(fixture("i915-kernel-doc-example.txt"), "drm-engine-video", "3000000000 ns"))
    assert busy is not None and busy.engines_ns["video"] == 1_500_000_000


@pytest.mark.parametrize(
    ("name", "render"),
    [("i915-memory-stats-example.txt", 25662044495), ("i915-proc_pid_fdinfo-man-example.txt", 346249)],
)
def test_i915_system_memory_is_not_vram(name: str, render: int) -> None:
    client = parse_client(fixture(name))
    assert client is not None and client.engines_ns["render"] == render
    assert client.vram_bytes is None  # system0 / stolen-system0: an integrated GPU has no VRAM


def test_xe_counts_cycles_with_capacities_and_vram0() -> None:
    client = parse_client(fixture("xe-kernel-doc-example.txt"))
    assert client is not None and client.key == ("xe", "0000:03:00.0", "3")
    assert client.engines_ns == {}
    assert client.cycles == {
        "rcs": CyclesSample(28257900, 7655183225, 1),
        "bcs": CyclesSample(0, 7655183225, 1),
        "vcs": CyclesSample(0, 7655183225, 2),
        "vecs": CyclesSample(0, 7655183225, 2),
        "ccs": CyclesSample(0, 7655183225, 4),
    }
    assert client.vram_bytes == 23992 * KiB  # drm-resident-vram0, not the gtt/system/stolen regions


def test_amdgpu_memory_vram_in_kib() -> None:
    client = parse_client(fixture("amdgpu-drm-engine-gfx-amdgpu_top-issue87.txt"))
    assert client is not None and client.key == ("amdgpu", "0000:08:00.0", "217")
    assert client.engines_ns == {"gfx": 107322799}
    assert client.vram_bytes == 2068 * KiB  # drm-memory-vram; gtt is not VRAM


def test_amdgpu_resident_vram_wins_over_the_legacy_key() -> None:
    text = fixture("amdgpu-drm-print-memory-stats-example.txt")
    client = parse_client(text)
    assert client is not None and client.engines_ns == {"compute": 46464671}
    assert client.vram_bytes == 44564 * KiB
    # where the two disagree the newer drm-resident-vram is the one read
    client = parse_client(edit(text, "drm-memory-vram", "1 KiB"))
    assert client is not None and client.vram_bytes == 44564 * KiB


def test_amdgpu_legacy_percent_format_has_no_per_client_drm_keys() -> None:
    text = fixture("amdgpu-legacy-5.15-percent-format.txt")
    assert parse_client(text) is None
    assert fdinfo_format(parse_fdinfo(text)) == "legacy"
    assert "no per-client drm- keys" in LEGACY_WHY


def test_amdgpu_apu_grep_reads_sizes_but_names_no_client() -> None:
    text = fixture("amdgpu-apu-llama-server-grep-drm-memory.txt")
    fields = parse_fdinfo(text)
    assert parse_size(fields["drm-memory-gtt"]) == 25258000 * KiB  # the 24 GB model, in GTT
    assert parse_size(fields["drm-memory-vram"]) == 5348 * KiB
    assert parse_client(text) is None  # a grep: no drm-driver line


@pytest.mark.parametrize(
    ("name", "driver", "engines"),
    [
        ("panfrost-kernel-doc-example.txt", "panfrost", {"fragment": 1846584880, "vertex-tiler": 71932239}),
        ("panthor-kernel-doc-example.txt", "panthor", {"panthor": 111110952750}),
        ("msm-glmark2-patch-example.txt", "msm", {"gpu": 1734371319}),
        (
            "v3d-computecloth-example.txt",
            "v3d",
            {"bin": 1661076898, "render": 31469427170, "tfu": 5002964, "csd": 188038329691, "cache_clean": 27736024038},
        ),
        (
            "v3d-memory-stats-example.txt",
            "v3d",
            {"bin": 4916187, "render": 154563573, "tfu": 10574, "csd": 0, "cache_clean": 0, "cpu": 0},
        ),
    ],
)
def test_arm_soc_drivers_count_ns(name: str, driver: str, engines: Mapping[str, int]) -> None:
    client = parse_client(fixture(name))
    assert client is not None and client.driver == driver and client.pdev == ""
    assert client.engines_ns == engines
    # drm-cycles without drm-total-cycles (panfrost, panthor, msm) say nothing about a share
    assert client.cycles == {}
    # their memory is one "memory" region of shared system RAM, not VRAM
    assert client.vram_bytes is None


def test_cycles_share_over_two_snapshots() -> None:
    first = fixture("xe-kernel-doc-example.txt")
    second = edit(first, "drm-cycles-rcs", str(28257900 + 1_000_000))
    second = edit(second, "drm-total-cycles-rcs", str(7655183225 + 4_000_000))
    second = edit(second, "drm-cycles-ccs", str(2_000_000))
    second = edit(second, "drm-total-cycles-ccs", str(7655183225 + 4_000_000))
    a, b = parse_client(first), parse_client(second)
    assert a is not None and b is not None
    assert cycles_share(a.cycles["rcs"], b.cycles["rcs"]) == pytest.approx(0.25)
    assert cycles_share(a.cycles["ccs"], b.cycles["ccs"]) == pytest.approx(0.125)  # 4 compute engines
    assert cycles_share(a.cycles["bcs"], b.cycles["bcs"]) is None  # its clock did not move
    assert cycles_share(b.cycles["rcs"], a.cycles["rcs"]) is None  # backwards


# --- the reader over a /proc tree ---------------------------------------------------------------


class Host:
    """A /proc, /sys and /dev the reader is pointed at."""

    def __init__(self, root: Path) -> None:
        self.proc, self.sys, self.dev = root / "proc", root / "sys", root / "dev"
        self.proc.mkdir()
        (self.dev / "dri").mkdir(parents=True)
        (self.dev / "dri" / "renderD128").touch()

    def fds(self, pid: int, fds: Mapping[int, str]) -> None:
        folder = self.proc / str(pid) / "fdinfo"
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for fd, text in {0: NOT_DRM, 1: NOT_DRM, **fds}.items():
            (folder / str(fd)).write_text(text)

    def reader(self) -> DrmFdinfoReader:
        options = DrmFdinfoReader.Options.model_validate({"kind": "drm_fdinfo"})
        return DrmFdinfoReader(
            options, PluginContext(state_dir=self.proc), proc_root=self.proc, sys_root=self.sys, dev_root=self.dev
        )


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_options_take_no_fields() -> None:
    DrmFdinfoReader.Options.model_validate({})
    with pytest.raises(ValidationError):
        DrmFdinfoReader.Options.model_validate({"kind": "drm_fdinfo", "path": "/proc"})


def test_a_client_counts_once_across_fds_and_processes(host: Host) -> None:
    shared = fixture("amdgpu-drm-engine-gfx-amdgpu_top-issue87.txt")
    own = edit(edit(shared, "drm-client-id", "218"), "drm-engine-gfx", "5000 ns")
    own = edit(own, "drm-memory-vram", "1 MiB")
    host.fds(100, {7: shared, 9: shared})  # one client, two fds (dup)
    host.fds(200, {7: shared, 12: own})  # a forked child: the parent's client and one of its own
    reading = host.reader().read([200, 100])
    assert reading.readable and reading.device == "gpu" and reading.unreadable == frozenset()
    assert reading.processes[100].busy_ns == {"gfx": 107322799}
    assert reading.processes[100].vram_bytes == 2068 * KiB
    assert reading.processes[200].busy_ns == {"gfx": 5000}
    assert reading.processes[200].vram_bytes == MiB


def test_the_same_client_id_on_another_device_is_another_client(host: Host) -> None:
    text = fixture("amdgpu-drm-engine-gfx-amdgpu_top-issue87.txt")
    host.fds(100, {7: text, 8: edit(text, "drm-pdev", "0000:09:00.0")})
    reading = host.reader().read([100])
    assert reading.processes[100].busy_ns == {"gfx": 2 * 107322799}


def test_counters_never_go_back(host: Host) -> None:
    text = fixture("i915-kernel-doc-example.txt")
    reader = host.reader()
    host.fds(100, {5: text})
    assert reader.read([100]).processes[100].busy_ns["render"] == 9288864723
    host.fds(100, {5: edit(text, "drm-engine-render", "9288000000 ns")})
    assert reader.read([100]).processes[100].busy_ns["render"] == 9288864723
    host.fds(100, {5: edit(text, "drm-engine-render", "9300000000 ns")})
    assert reader.read([100]).processes[100].busy_ns["render"] == 9300000000


def test_a_closed_client_keeps_what_it_counted(host: Host) -> None:
    a = fixture("v3d-memory-stats-example.txt")
    b = edit(edit(a, "drm-client-id", "82"), "drm-engine-render", "1000 ns")
    reader = host.reader()
    host.fds(100, {4: a, 5: b})
    assert reader.read([100]).processes[100].busy_ns["render"] == 154563573 + 1000
    host.fds(100, {4: edit(a, "drm-engine-render", "154564573 ns")})  # fd 5 closed; a worked 1000 ns
    assert reader.read([100]).processes[100].busy_ns["render"] == 154563573 + 2000
    host.fds(100, {})  # all closed: still listed, unchanged, holding no memory
    after = reader.read([100]).processes[100]
    assert after.busy_ns["render"] == 154563573 + 2000 and after.vram_bytes == 0


def test_cycles_become_busy_ns_over_wall_time(host: Host) -> None:
    first = fixture("xe-kernel-doc-example.txt")
    reader = host.reader()
    host.fds(300, {6: first})
    one = reader.read([300])
    assert one.processes[300].busy_ns == {"rcs": 0, "bcs": 0, "vcs": 0, "vecs": 0, "ccs": 0}  # a baseline
    assert one.processes[300].vram_bytes == 23992 * KiB
    second = edit(first, "drm-cycles-rcs", str(28257900 + 1_000_000))
    for engine in ("rcs", "bcs", "vcs", "vecs", "ccs"):
        second = edit(second, f"drm-total-cycles-{engine}", str(7655183225 + 4_000_000))
    second = edit(second, "drm-cycles-ccs", str(2_000_000))
    host.fds(300, {6: second})
    two = reader.read([300])
    wall = two.at_ns - one.at_ns
    busy = two.processes[300].busy_ns
    assert busy["rcs"] == round(0.25 * wall)
    assert busy["ccs"] == round(0.125 * wall)
    assert busy["bcs"] == 0
    # a third snapshot with the counters reset: nothing is added, nothing taken away
    host.fds(300, {6: first.replace("7655183225", "100")})
    three = reader.read([300]).processes[300].busy_ns
    assert three["rcs"] == busy["rcs"] and three["ccs"] == busy["ccs"]


def test_denied_processes_are_unreadable_and_gone_ones_absent(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    host.fds(100, {5: fixture("panthor-kernel-doc-example.txt")})
    host.fds(101, {5: edit(fixture("panthor-kernel-doc-example.txt"), "drm-client-id", "11")})
    reader = host.reader()
    real = reader._fdinfo_texts

    def denied(pid: int) -> Iterator[tuple[str, str]]:
        if pid == 101:
            raise PermissionError(13, "Permission denied")
        return real(pid)

    monkeypatch.setattr(reader, "_fdinfo_texts", denied)
    reading = reader.read([100, 101, 99999])  # 99999 has no /proc entry: it exited
    assert reading.readable
    assert reading.unreadable == frozenset({101})
    assert set(reading.processes) == {100}


def test_legacy_amdgpu_reads_as_unreadable(host: Host) -> None:
    host.fds(100, {7: fixture("amdgpu-legacy-5.15-percent-format.txt")})
    reading = host.reader().read([100])
    assert not reading.readable and reading.why == LEGACY_WHY
    assert "no per-client drm- keys" in reading.why and reading.processes == {}


def test_processes_without_clients_on_a_host_with_some(host: Host) -> None:
    host.fds(100, {})
    host.fds(300, {6: fixture("xe-kernel-doc-example.txt")})  # someone else uses the GPU
    reading = host.reader().read([100])
    assert reading.readable and reading.processes == {}


def test_no_client_anywhere_is_not_readable(host: Host) -> None:
    host.fds(100, {})
    reading = host.reader().read([100])
    assert not reading.readable and reading.why == NO_CLIENT_WHY
    (host.dev / "dri" / "renderD128").unlink()
    reading = host.reader().read([100])
    assert not reading.readable and reading.why == NO_DEVICE_WHY


def test_device_vram_from_sysfs(host: Host) -> None:
    host.fds(100, {7: fixture("amdgpu-drm-engine-gfx-amdgpu_top-issue87.txt")})
    assert host.reader().read([100]).vram_total_bytes is None  # no card publishes it (i915, xe, ...)
    device = host.sys / "class" / "drm" / "card1" / "device"
    device.mkdir(parents=True)
    (device / "mem_info_vram_total").write_text(f"{8 * GiB}\n")
    (device / "mem_info_vram_used").write_text(f"{3 * GiB}\n")
    (host.sys / "class" / "drm" / "card1-DP-1").mkdir()  # a connector, not a card
    reading = host.reader().read([100])
    assert reading.vram_total_bytes == 8 * GiB and reading.vram_free_bytes == 5 * GiB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_plain_process_on_this_machine() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        options = DrmFdinfoReader.Options.model_validate({"kind": "drm_fdinfo"})
        reading = DrmFdinfoReader(options, PluginContext(state_dir=Path("."))).read([child.pid, os.getpid()])
    finally:
        child.kill()
        child.wait(timeout=10)
    print(f"readable={reading.readable} why={reading.why!r}")
    assert child.pid not in reading.processes and reading.why
    assert reading.processes == {} or reading.readable
    assert reading.at_ns > 0


def test_a_shared_client_counts_for_its_new_holder_only_from_the_handover(host: Host) -> None:
    text = fixture("panfrost-kernel-doc-example.txt")
    host.fds(100, {5: text})  # the parent
    host.fds(200, {5: text})  # its child, which inherited the client
    reader = host.reader()
    one = reader.read([100, 200])
    assert one.processes[100].busy_ns["fragment"] == 1846584880 and 200 not in one.processes
    # the parent exits; the child goes on using the client
    shutil.rmtree(host.proc / "100")
    host.fds(200, {5: edit(text, "drm-engine-fragment", f"{1846584880 + 7000} ns")})
    two = reader.read([200])
    assert two.processes[200].busy_ns["fragment"] == 7000
    assert set(two.processes) == {200}
