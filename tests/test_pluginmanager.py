"""The plugin manager: discovery, duplicate kinds, blocking, isolation of failing plugins."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections.abc import Callable, Generator, Sequence
from typing import Any

import pytest

from arbiter.plugin import KindOptions, Matcher, ProcessInfo, hookimpl
from arbiter.pluginmanager import PluginFailed, PluginLoadError, build_plugin_manager
from arbiter.pluginsteps import Pool, Step, one, run_steps
from arbiter_testing import wait_until


class Every(Matcher):
    class Options(KindOptions):
        pass

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        return {p.pid for p in processes}


def plugin_module(name: str, kind: str = "every", cls: type = Every) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def arbiter_register_matchers(register: Callable[[str, type], None]) -> None:
        register(kind, cls)

    module.arbiter_register_matchers = arbiter_register_matchers  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module


SHIPPED = {
    "matchers": ("arbiter-matchers", {"matchers/process"}),
    "readers": ("arbiter-readers", {"readers/cpu_time", "readers/drm_fdinfo", "readers/nvml", "readers/macos_ioreg"}),
    "sources": (
        "arbiter-sources",
        {
            "sources/jsonl",
            "sources/log",
            "sources/exec",
            "sources/on_exec",
            "sources/http_count",
            "sources/http_value",
            "sources/prometheus",
            "sources/vram",
            "sources/websocket",
        },
    ),
    "translators": (
        "arbiter-translators",
        {
            "translators/signal",
            "translators/cgroup_freeze",
            "translators/control_doc",
            "translators/http_post",
            "translators/gpu_profile",
            "translators/cuda_checkpoint",
        },
    ),
    "testing": ("arbiter-testing", {"readers/fake", "translators/fake_profile"}),
    "host": ("arbiter-host", {"host/memory", "host/power", "host/machine", "host/access"}),
    "nfd": ("arbiter-nfd", set()),
    "slurm": ("arbiter-slurm", {"translators/slurm"}),
    "probes": (
        "arbiter-probes",
        {
            "probes/cuda",
            "probes/rocm",
            "probes/vulkan",
            "probes/opencl",
            "probes/metal",
            "probes/directml",
            "probes/containers",
        },
    ),
}


@pytest.mark.parametrize("entry_point", sorted(SHIPPED))
def test_each_shipped_distribution_registers_through_its_entry_point(entry_point: str) -> None:
    """As a third party's would: through the ``arbiter`` entry point group, with strict options."""
    host = build_plugin_manager()  # check_pending() inside: every hook implementation has a spec
    listing = {p["name"]: p for p in host.plugins()}
    distribution, kinds = SHIPPED[entry_point]
    assert listing[entry_point]["distribution"].startswith(f"{distribution} ")
    assert set(listing[entry_point]["kinds"]) == kinds
    for kind in kinds:
        family, name = kind.split("/")
        model = host.options_model(family, name)
        assert model is not None and model.model_config.get("extra") == "forbid"
    for section in listing[entry_point]["sections"]:
        assert host.section_models()[section].model_config.get("extra") == "forbid"


def test_modules_named_in_config_are_loaded() -> None:
    plugin_module("site_plugin_a")
    host = build_plugin_manager(modules=["site_plugin_a"], entry_points=False)
    info = host.kind("matchers", "every")
    assert info is not None and info.plugin == "site_plugin_a"


def test_a_missing_module_is_a_clear_error() -> None:
    with pytest.raises(PluginLoadError, match=r"'no_such_arbiter_plugin'.*cannot be imported"):
        build_plugin_manager(modules=["no_such_arbiter_plugin"], entry_points=False)


def test_duplicate_kind_names_both_plugins() -> None:
    plugin_module("site_plugin_b")
    plugin_module("site_plugin_c")
    with pytest.raises(PluginLoadError) as err:
        build_plugin_manager(modules=["site_plugin_b", "site_plugin_c"], entry_points=False)
    assert "site_plugin_b" in str(err.value) and "site_plugin_c" in str(err.value)


def test_disable_plugins_blocks_entry_points_and_modules() -> None:
    host = build_plugin_manager(disable=["translators"])
    assert not {"signal", "control_doc", "http_post", "gpu_profile"} & set(host.kind_names("translators"))
    assert any(p["name"] == "translators" and p.get("blocked") for p in host.plugins())


def test_registering_a_non_kind_is_refused() -> None:
    plugin_module("site_plugin_d", cls=dict)
    with pytest.raises(PluginLoadError, match=r"not a subclass of arbiter\.plugin\.Matcher"):
        build_plugin_manager(modules=["site_plugin_d"], entry_points=False)


def test_unknown_hook_is_refused_by_check_pending() -> None:
    module = types.ModuleType("site_plugin_e")

    @hookimpl
    def arbiter_no_such_hook() -> int:
        return 1

    module.arbiter_no_such_hook = arbiter_no_such_hook  # type: ignore[attr-defined]
    sys.modules["site_plugin_e"] = module
    with pytest.raises(PluginLoadError, match="does not have"):
        build_plugin_manager(modules=["site_plugin_e"], entry_points=False)


def test_calls_are_isolated_and_time_out() -> None:
    host = build_plugin_manager(entry_points=False, timeout_s=0.2)

    def boom() -> None:
        raise RuntimeError("driver exploded")

    with pytest.raises(PluginFailed, match="RuntimeError: driver exploded"):
        host.call("readers/x", boom)
    started = time.monotonic()
    with pytest.raises(PluginFailed, match=r"no answer within 0\.2s"):
        host.call("readers/slow", time.sleep, 5)
    assert time.monotonic() - started < 1.0
    with pytest.raises(PluginFailed, match=r"no answer within 0\.2s, and that call is still running"):
        host.call("readers/slow", lambda: 1)  # no second worker is tied up behind a hung one
    assert host.call("ok", lambda: 42) == 42
    host.close()


def test_calls_made_together_run_on_one_pool_thread_each_isolated_and_timed() -> None:
    """A tick's source readings hand over to the pool once: one thread runs them all, in
    order; one that raises or hangs fails alone, and those after a hung one still answer."""
    host = build_plugin_manager(entry_points=False, timeout_s=0.3)
    threads: list[int] = []

    def here(value: int) -> int:
        threads.append(threading.get_ident())
        return value

    def boom() -> None:
        raise RuntimeError("driver exploded")

    answers = host.call_each([("a", here, (1,)), ("b", boom, ()), ("c", here, (3,))])
    assert answers[0] == 1 and answers[2] == 3
    assert isinstance(answers[1], PluginFailed) and "RuntimeError: driver exploded" in answers[1].why
    assert len(threads) == 2 and threads[0] == threads[1] != threading.get_ident()
    started = time.monotonic()
    answers = host.call_each([("a", here, (1,)), ("slow", time.sleep, (5,)), ("c", here, (3,))])
    assert answers[0] == 1 and answers[2] == 3
    assert isinstance(answers[1], PluginFailed) and answers[1].why == "no answer within 0.3s"
    assert time.monotonic() - started < 2.0
    answers = host.call_each([("slow", lambda: 1, ())])  # refused while the hung one runs, as call() does
    assert isinstance(answers[0], PluginFailed) and "still running" in answers[0].why
    host.close()


def test_a_run_of_steps_hands_over_once_and_goes_on_without_a_step_that_hangs() -> None:
    """A tick's plugin calls, each depending on the one before, run on one pool thread with
    the code between them; a call that hangs fails alone, at its own timeout, and the run goes
    on from there on the caller's thread, the hung thread never touching it again."""
    host = build_plugin_manager(entry_points=False, timeout_s=0.3)
    release = threading.Event()
    shell: list[int] = []  # the threads that ran the code between the calls
    made: list[str] = []

    def plugin(label: str) -> str:
        made.append(label)
        return label.upper()

    def hang() -> str:
        release.wait(10)
        return "late"

    def run(hung_at: str) -> Generator[Step, Any, list[str]]:
        out = []
        for label in ("table", "matchers", "readers"):
            shell.append(threading.get_ident())
            try:
                out.append(
                    (yield Step(label, hang if label == hung_at else plugin, (label,) if label != hung_at else ()))
                )
            except PluginFailed as exc:
                out.append(exc.why)
        shell.append(threading.get_ident())
        return out

    assert host.run_steps(run("")) == ["TABLE", "MATCHERS", "READERS"]
    assert len(set(shell)) == 1 and shell[0] != threading.get_ident()
    shell.clear()
    made.clear()
    started = time.monotonic()
    assert host.run_steps(run("matchers")) == ["TABLE", "no answer within 0.3s", "READERS"]
    assert time.monotonic() - started < 2.0
    assert shell[-1] == threading.get_ident() != shell[0]  # the rest ran here
    release.set()

    def hung_one_returned() -> bool:  # its label is refused until its thread is done
        try:
            return host.call("matchers", lambda: True)
        except PluginFailed:
            return False

    wait_until(hung_one_returned, timeout_s=10, what="the hung call returned")
    assert made == ["table", "readers"]  # the hung thread did not run the generator on
    host.close()


def test_a_run_no_pool_thread_takes_up_is_made_from_the_caller_at_its_timeout() -> None:
    """Every pool thread taken by calls that hang: the tick does not wait for one forever."""
    pool = Pool(1, "taken")
    release = threading.Event()
    pool.submit(release.wait, 10)  # the one thread, taken
    made: list[int] = []

    def call(label: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        made.append(threading.get_ident())
        return fn(*args)

    try:
        started = time.monotonic()
        value, _ = run_steps(
            pool.submit,
            one("table", str.upper, "t"),
            timeout_s=0.3,
            refuse=lambda _: None,
            hung=lambda *_: None,
            call=call,
        )
        assert value == "T" and made == [threading.get_ident()]
        assert time.monotonic() - started < 5.0
    finally:
        release.set()
        pool.close()


def _switches(native_id: int) -> int:
    """A thread's context switches so far (each time it went to sleep, or was put aside)."""
    with open(f"/proc/self/task/{native_id}/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_a_hand_over_wakes_only_the_pool_thread_it_gives_work_to() -> None:
    """Idle pool threads each wait on their own: a call wakes one (the one idle last), never
    the others (a pool whose threads share one queue woke a second one on every call)."""
    elsewhere = {t.native_id for t in threading.enumerate()}  # other tests' pools' threads, still ending
    host = build_plugin_manager(entry_points=False)
    together = threading.Barrier(3)  # three calls at once: three pool threads
    callers = [threading.Thread(target=host.call, args=(f"c{i}", together.wait)) for i in range(3)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    threads = [
        t.native_id
        for t in threading.enumerate()
        if t.name.startswith("plugin_") and t.native_id and t.native_id not in elsewhere
    ]
    assert len(threads) == 3

    def asleep() -> dict[int, int] | None:
        """Each thread's switches once none moves over a look: each is in its wait (a thread
        still on its way there when its count is read is woken by nothing)."""
        first = {tid: _switches(tid) for tid in threads}
        time.sleep(0.05)
        return first if first == {tid: _switches(tid) for tid in threads} else None

    before = wait_until(asleep, 10, "the pool's threads in their waits")
    used = {host.call("one", threading.get_native_id) for _ in range(20)}
    assert len(used) == 1, "the thread idle last takes every call"
    moved = {tid for tid, n in before.items() if _switches(tid) != n}
    assert moved == used, f"threads woken: {moved}, used: {used}"
    host.close()


def test_a_pool_past_its_threads_queues_a_call_and_cancels_it_on_close() -> None:
    pool = Pool(1, "one")
    release = threading.Event()
    taken = pool.submit(release.wait, 10)
    queued = pool.submit(lambda: "later")
    assert not queued.done()
    release.set()
    assert taken.result(5) is True and queued.result(5) == "later"
    release.clear()
    pool.submit(release.wait, 10)
    cancelled = pool.submit(lambda: "never")
    pool.close()
    assert cancelled.cancelled()
    release.set()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(lambda: None)
