"""``cgroup_freeze`` against a real cgroup v2 folder (where this account may make one), and
its fallback to signals for a cgroup the job shares."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from arbiter.plugin import JobTarget, PluginContext, ProcessRef
from arbiter_testing.waiting import wait_until
from arbiter_translators import CgroupFreezeTranslator, arbiter_register_translators
from arbiter_translators.cgroup import cgroup2_mount

# each count written whole (a temporary file renamed into place), so a freeze mid-write
# never shows a half-written number
COUNTER = (
    "import os, sys, time\nn = 0\nwhile True:\n    n += 1\n"
    "    open(sys.argv[1] + '.tmp', 'w').write(str(n))\n    os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "    time.sleep(0.01)"
)


def ref(proc: subprocess.Popen[bytes]) -> ProcessRef:
    return ProcessRef(proc.pid, psutil.Process(proc.pid).create_time())


def stopped(proc: subprocess.Popen[bytes]) -> bool:
    return bool(psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED)


def count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


@pytest.fixture
def translator(tmp_path: Path) -> CgroupFreezeTranslator:
    return CgroupFreezeTranslator(CgroupFreezeTranslator.Options(), PluginContext(state_dir=tmp_path))


@pytest.fixture
def own_group() -> Iterator[Path]:
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy on this host")
    folder = Path(mount) / f"arbiter-test-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here ({exc.strerror})")
    try:
        yield folder
    finally:
        for pid in (folder / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        wait_until(lambda: not (folder / "cgroup.procs").read_text().strip(), 10, "the cgroup to empty", poll_s=0.02)
        folder.rmdir()


def test_registered_beside_signal() -> None:
    seen: dict[str, type] = {}
    arbiter_register_translators(lambda name, cls: seen.__setitem__(name, cls))
    assert seen["cgroup_freeze"] is CgroupFreezeTranslator
    assert {"pause", "resume", "terminate", "kill"} <= CgroupFreezeTranslator.actions


def test_a_job_alone_in_its_cgroup_is_frozen_and_thawed(
    translator: CgroupFreezeTranslator, own_group: Path, tmp_path: Path
) -> None:
    out = tmp_path / "n"
    proc = subprocess.Popen([sys.executable, "-c", COUNTER, str(out)])
    try:
        (own_group / "cgroup.procs").write_text(str(proc.pid))
        wait_until(lambda: count(out) >= 3, 10, "the counter to count in its cgroup")
        target = JobTarget("j1", "counter", (ref(proc),))
        assert translator.own_cgroup(target) == str(own_group)
        started = time.monotonic()
        assert translator.pause(target) == [ref(proc)]
        print(f"\nfroze the job's cgroup in {1000 * (time.monotonic() - started):.2f} ms")
        assert translator.is_frozen(str(own_group))
        frozen_at = count(out)
        # Nothing to wait for: a frozen counter writes nothing, however long it is given.  Its
        # 10 ms steps would have counted many times by now were it running; on a loaded host
        # this checks less, never wrongly.
        time.sleep(0.2)
        assert count(out) == frozen_at
        assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED  # frozen, not SIGSTOPped
        translator.resume([ref(proc)])
        assert not translator.is_frozen(str(own_group))
        wait_until(lambda: count(out) > frozen_at, 10, "the thawed counter to count on")
        translator.pause(target)
        translator.terminate(target)  # thawed first, so SIGTERM ends it
        assert proc.wait(5) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_cgroup_shared_with_other_processes_is_never_frozen(
    translator: CgroupFreezeTranslator, tmp_path: Path
) -> None:
    out = tmp_path / "n"
    proc = subprocess.Popen([sys.executable, "-c", COUNTER, str(out)])  # in the test runner's own cgroup
    try:
        target = JobTarget("j1", "counter", (ref(proc),))
        assert translator.own_cgroup(target) is None
        paused = translator.pause(target)
        assert paused == [ref(proc)]
        wait_until(lambda: stopped(proc), 10, "the job stopped with signals instead")
        translator.resume(paused)
        wait_until(lambda: not stopped(proc), 10, "the job continued")
    finally:
        proc.kill()
        proc.wait()


def test_what_it_paused_with_signals_is_continued_without_a_cgroup_lookup_and_the_rest_with_one(
    translator: CgroupFreezeTranslator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter_translators import cgroup

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        mine, earlier = ref(procs[0]), ref(procs[1])
        assert translator.pause(JobTarget("j1", "mine", (mine,))) == [mine]  # a cgroup it shares: signals
        os.kill(earlier.pid, 19)  # SIGSTOP, as a daemon before this one left it
        wait_until(lambda: all(stopped(proc) for proc in procs), 10, "both stopped")  # so continuing them shows
        looked_up: list[int] = []
        real = cgroup.cgroup_of

        def looking_up(pid: int) -> str | None:
            looked_up.append(pid)
            return real(pid)

        monkeypatch.setattr(cgroup, "cgroup_of", looking_up)
        translator.resume([mine, earlier])
        assert looked_up == [earlier.pid]
        wait_until(lambda: not any(stopped(proc) for proc in procs), 10, "both continued")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_job_found_sharing_its_cgroup_is_paused_again_with_signals_without_a_lookup_until_the_recheck(
    translator: CgroupFreezeTranslator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter_translators import cgroup

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # in the runner's cgroup
    looked_up: list[int] = []
    real = cgroup.cgroup_of

    def looking_up(pid: int) -> str | None:
        looked_up.append(pid)
        return real(pid)

    monkeypatch.setattr(cgroup, "cgroup_of", looking_up)
    try:
        target = JobTarget("j1", "mine", (ref(proc),))
        for _ in range(3):
            assert translator.pause(target) == [ref(proc)]
            translator.resume([ref(proc)])
        assert looked_up == [proc.pid]  # found shared once; paused twice more with signals alone
        monkeypatch.setattr(cgroup, "SHARED_RECHECK_S", 0.0)
        assert translator.pause(target) == [ref(proc)]
        assert looked_up == [proc.pid, proc.pid]  # looked at again once the recheck is due
        translator.resume([ref(proc)])
    finally:
        proc.kill()
        proc.wait()


def test_settle_waits_only_for_what_it_stopped_with_signals(translator: CgroupFreezeTranslator) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # in the runner's cgroup
    try:
        target = JobTarget("j1", "mine", (ref(proc),))
        assert translator.pause(target) == [ref(proc)]  # with signals: a cgroup it shares
        assert translator.settle([ref(proc)], timeout_s=5.0)
        assert psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED
        translator.resume([ref(proc)])
        # not stopped by it now (as a frozen task never reads as stopped): nothing to wait for
        started = time.monotonic()
        assert translator.settle([ref(proc)], timeout_s=5.0)
        assert time.monotonic() - started < 1.0
    finally:
        proc.kill()
        proc.wait()


def test_the_root_of_the_hierarchy_is_never_a_jobs_own(
    translator: CgroupFreezeTranslator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter_translators import cgroup

    monkeypatch.setattr(cgroup, "cgroup_of", lambda pid: "/")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert translator.own_cgroup(JobTarget("j", "x", (ref(proc),))) is None
    finally:
        proc.kill()
        proc.wait()


def test_mountinfo_parsing(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n"
        "35 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:14 - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_mount(str(info)) == "/sys/fs/cgroup/unified"
    info.write_text("30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    assert cgroup2_mount(str(info)) is None


def test_a_child_cgroup_holding_a_stranger_is_never_frozen(
    translator: CgroupFreezeTranslator, own_group: Path, tmp_path: Path
) -> None:
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child = own_group / "inner"
    try:
        (own_group / "cgroup.procs").write_text(str(job.pid))
        child.mkdir()
        (child / "cgroup.procs").write_text(str(stranger.pid))
        assert translator.own_cgroup(JobTarget("j1", "x", (ref(job),))) is None
        # and a job with a process outside its cgroup is not its cgroup's alone either
        assert translator.own_cgroup(JobTarget("j1", "x", (ref(job), ref(stranger)))) == str(own_group)
    finally:
        for proc in (job, stranger):
            proc.kill()
            proc.wait()
        wait_until(lambda: not (child / "cgroup.procs").read_text().strip(), 10, "the cgroup to empty", poll_s=0.02)
        child.rmdir()


def test_a_job_partly_outside_its_cgroup_is_paused_with_signals(
    translator: CgroupFreezeTranslator, own_group: Path
) -> None:
    inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (own_group / "cgroup.procs").write_text(str(inside.pid))
        target = JobTarget("j1", "x", (ref(inside), ref(outside)))
        assert translator.own_cgroup(target) is None
        translator.pause(target)
        wait_until(lambda: stopped(inside) and stopped(outside), 10, "both stopped with signals")
        translator.resume(list(target.processes))
    finally:
        for proc in (inside, outside):
            proc.kill()
            proc.wait()


def test_a_cgroup_whose_pids_match_the_job_but_not_its_processes_is_never_frozen(
    translator: CgroupFreezeTranslator, own_group: Path
) -> None:
    """Membership is judged by process, not by pid: a member whose start time is not the one
    the job recorded is another process that took a pid of the job's."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        for proc in procs:
            (own_group / "cgroup.procs").write_text(str(proc.pid))
        root, other = ref(procs[0]), ref(procs[1])
        assert translator.own_cgroup(JobTarget("j1", "x", (root, other))) == str(own_group)
        reused = ProcessRef(other.pid, other.start_time - 5.0)
        assert translator.own_cgroup(JobTarget("j1", "x", (root, reused))) is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
