"""Finding plugins, collecting the kinds they register, and calling them safely.

It runs past 400 lines because the host's typed look-ups (an overload per family) and its
safe calls (one under a timeout, a run of steps, the labels still hung) share one pool and
its lock.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar, overload

import pluggy
from pydantic import BaseModel

from arbiter import hookspecs
from arbiter.config.models import NodeConfig
from arbiter.config.sections import misspelling_of, plugin_sections
from arbiter.plugin import (
    PROJECT,
    HostSignal,
    KindOptions,
    Matcher,
    PluginContext,
    Probe,
    Reader,
    Source,
    Translator,
)
from arbiter.pluginsteps import PluginFailed as PluginFailed
from arbiter.pluginsteps import Pool, Steps, counting_children, each, run_steps
from arbiter.runtime.bell import Bell

T = TypeVar("T")

FAMILIES: dict[str, type] = {
    "matchers": Matcher,
    "sources": Source,
    "readers": Reader,
    "probes": Probe,
    "translators": Translator,
    "host": HostSignal,
}
_SECTION_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class PluginLoadError(Exception):
    """A plugin could not be loaded or registered something invalid."""


K = TypeVar("K", Matcher, Source, Reader, Probe, Translator, HostSignal)
#: a family's name, as the hooks, rule files and the node config write it
Family = Literal["matchers", "sources", "readers", "probes", "translators", "host"]


@dataclass(frozen=True)
class KindInfo(Generic[K]):
    """A kind a plugin registered: ``cls`` is a subclass of its family's base (checked when
    the plugin registers it), so its ``Options`` and class attributes are typed."""

    family: str
    name: str
    cls: type[K]
    plugin: str  # the plugin (entry point or module) that registered it
    distribution: str  # "name version", or "" for a module named in the config


@dataclass(frozen=True)
class SectionInfo:
    """A section of the node config that a plugin reads (``arbiter_register_node_sections``)."""

    name: str
    model: type[KindOptions]
    plugin: str
    distribution: str  # "name version", or "" for a module named in the config


@dataclass
class PluginHost:
    """The pluggy manager plus the kinds every plugin registered."""

    pm: pluggy.PluginManager
    kinds: dict[str, dict[str, KindInfo[Any]]] = field(default_factory=dict)
    #: the node config's sections that plugins read, by name
    sections: dict[str, SectionInfo] = field(default_factory=dict)
    timeout_s: float = 5.0
    blocked: set[str] = field(default_factory=set)
    _pool: Pool | None = None
    _pool_lock: threading.Lock = field(default_factory=threading.Lock)
    _hung: dict[str, concurrent.futures.Future[Any]] = field(default_factory=dict)
    #: per calling thread: CPU seconds its calls spent on pool threads (see :meth:`worker_cpu`),
    #: and the bell it waits on for a run of steps
    _spent: threading.local = field(default_factory=threading.local)
    #: the last node config given to :meth:`context` and its sections, validated
    _sections_of: tuple[NodeConfig, Mapping[str, KindOptions]] | None = None

    @property
    def hook(self) -> Any:
        return self.pm.hook

    @overload
    def kind(self, family: Literal["matchers"], name: str) -> KindInfo[Matcher] | None: ...
    @overload
    def kind(self, family: Literal["sources"], name: str) -> KindInfo[Source] | None: ...
    @overload
    def kind(self, family: Literal["readers"], name: str) -> KindInfo[Reader] | None: ...
    @overload
    def kind(self, family: Literal["probes"], name: str) -> KindInfo[Probe] | None: ...
    @overload
    def kind(self, family: Literal["translators"], name: str) -> KindInfo[Translator] | None: ...
    @overload
    def kind(self, family: Literal["host"], name: str) -> KindInfo[HostSignal] | None: ...
    @overload
    def kind(self, family: str, name: str) -> KindInfo[Any] | None: ...
    def kind(self, family: str, name: str) -> KindInfo[Any] | None:
        """The kind ``name`` of ``family``, typed by the family's base class where it is named."""
        return self.kinds.get(family, {}).get(name)

    def translators(self) -> dict[str, KindInfo[Translator]]:
        """Every installed translator kind, by name."""
        return dict(self.kinds.get("translators", {}))

    def options_model(self, family: str, name: str) -> type[BaseModel] | None:
        info = self.kind(family, name)
        return info.cls.Options if info else None

    def context(self, config: NodeConfig, **extra: Any) -> PluginContext:
        """The context the daemon gives a plugin instance or a hook, for ``config`` (its state
        dir, its plugin sections validated), with ``extra`` fields (``rule_id``...)."""
        return PluginContext(
            state_dir=config.state_path(),
            stand_in_gpu=config.stand_in_gpu,
            daemon_uid=os.geteuid(),
            sections=self._validated_sections(config),
            **extra,
        )

    def _validated_sections(self, config: NodeConfig) -> Mapping[str, KindOptions]:
        """``config``'s plugin sections, validated once: the hooks that take a context are
        called every few seconds, on the same config (a problem would be logged each time)."""
        known = self._sections_of
        if known is None or known[0] is not config:
            known = (config, MappingProxyType(plugin_sections(config, self.section_models(), self.blocked)))
            self._sections_of = known
        return known[1]

    def section_models(self) -> dict[str, type[KindOptions]]:
        """The node config's plugin sections: each one's name and the model that validates it."""
        return {name: info.model for name, info in self.sections.items()}

    def kind_names(self, family: str) -> list[str]:
        """The kinds of ``family``; ``translators:ACTION``, the translator kinds that can do
        ACTION (``release``, ``reacquire``, ``profile``...)."""
        family, _, action = family.partition(":")
        kinds = self.kinds.get(family, {})
        if action:
            return sorted(n for n, info in kinds.items() if action in getattr(info.cls, "actions", ()))
        return sorted(kinds)

    def plugins(self) -> list[dict[str, Any]]:
        """Every registered plugin with its distribution, the kinds it registered and the node
        config's sections it reads."""
        dists = {self.pm.get_name(p): f"{d.project_name} {d.version}" for p, d in self.pm.list_plugin_distinfo()}
        out: list[dict[str, Any]] = []
        for plugin in self.pm.get_plugins():
            name = self.pm.get_name(plugin)
            if name is None or name == "arbiter.hookspecs":
                continue
            kinds = sorted(
                f"{info.family}/{info.name}"
                for fam in self.kinds.values()
                for info in fam.values()
                if info.plugin == name
            )
            sections = sorted(s.name for s in self.sections.values() if s.plugin == name)
            out.append({"name": name, "distribution": dists.get(name, ""), "kinds": kinds, "sections": sections})
        blocked = [
            {"name": n, "distribution": "", "kinds": [], "sections": [], "blocked": True} for n in sorted(self.blocked)
        ]
        return sorted(out, key=lambda p: p["name"]) + blocked

    def call(self, label: str, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Call plugin code with a timeout; raise :class:`PluginFailed` on error or hang.

        A hung call cannot be killed from Python: its worker thread is left behind, and
        until it returns every further call with the same ``label`` fails at once instead of
        tying up another worker (fail safe: the caller treats the plugin as failed).
        """
        with self._pool_lock:
            self._refuse_while_hung(label)
        pool = self._executor()
        cell = [0.0]

        def timed() -> T:
            started = time.thread_time()
            children = [0.0]
            try:
                return counting_children(children, fn, *args)
            finally:
                cell[0] = time.thread_time() - started + children[0]

        future = pool.submit(timed)
        limit = timeout if timeout is not None else self.timeout_s
        try:
            result = future.result(timeout=limit)
            self._spent.cpu = getattr(self._spent, "cpu", 0.0) + cell[0]
            return result
        except concurrent.futures.TimeoutError:
            with self._pool_lock:
                future.limit_s = limit  # type: ignore[attr-defined]
                self._hung[label] = future
            raise PluginFailed(label, f"no answer within {limit:g}s") from None
        except Exception as exc:  # any plugin exception is isolated here
            self._spent.cpu = getattr(self._spent, "cpu", 0.0) + cell[0]
            raise PluginFailed(label, f"{type(exc).__name__}: {exc}") from exc

    def call_each(self, calls: Sequence[tuple[str, Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
        """Each ``(label, fn, args)`` as :meth:`call` calls it, with the default timeout, one
        after another on one pool thread: what each returned, or the :class:`PluginFailed`
        it met (see :meth:`run_steps`)."""
        return self.run_steps(each(calls))

    def run_steps(self, steps: Steps[T]) -> T:
        """Run a generator of plugin calls (:class:`arbiter.pluginsteps.Step`) on one pool
        thread, each call under its timeout, and return what it returns: one hand-over for
        them all, not one each (:mod:`arbiter.pluginsteps` says why and how).  A call that
        hangs is left behind as :meth:`call` leaves it, and the steps after it go through
        :meth:`call` on this thread."""

        def refuse(label: str) -> None:
            with self._pool_lock:
                self._refuse_while_hung(label)

        def hung(label: str, future: concurrent.futures.Future[None], limit: float) -> None:
            with self._pool_lock:
                future.limit_s = limit  # type: ignore[attr-defined]
                self._hung[label] = future

        bell = getattr(self._spent, "bell", None)
        if bell is None:  # each calling thread waits on a bell of its own
            bell = self._spent.bell = Bell()
        value, cpu = run_steps(
            self._executor().submit,
            steps,
            timeout_s=self.timeout_s,
            refuse=refuse,
            hung=hung,
            call=self.call,
            bell=bell,
        )
        self._spent.cpu = getattr(self._spent, "cpu", 0.0) + cpu
        return value

    def _executor(self) -> Pool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = Pool(32, "plugin")
            return self._pool

    def call_here(self, label: str, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`call` on the calling thread, without a timeout, for plugin code that bounds
        its own time (:attr:`arbiter.plugin.Translator.bounded`): its exceptions are isolated
        the same way, and a label with a call still hung on a pool thread fails at once."""
        with self._pool_lock:
            self._refuse_while_hung(label)
        children = [0.0]
        try:
            return counting_children(children, fn, *args)
        except Exception as exc:  # any plugin exception is isolated here
            raise PluginFailed(label, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._spent.cpu = getattr(self._spent, "cpu", 0.0) + children[0]

    def fast_thread(self, role: str) -> str:
        """Run ``arbiter_fast_thread`` on the calling thread (see that hook): what the
        plugins did, or why nothing was done.  Raises nothing."""
        try:
            said = [s for s in self.pm.hook.arbiter_fast_thread(role=role) if s]
        except Exception as exc:  # a hint is never worth a fast-path thread
            return f"a plugin failed: {type(exc).__name__}: {exc}"
        return "; ".join(str(s) for s in said) or "nothing: no plugin gives this host a hint"

    def _refuse_while_hung(self, label: str) -> None:
        """Under ``_pool_lock``: fail at once while an earlier call with ``label`` still hangs."""
        hung = self._hung.get(label)
        if hung is not None and not hung.done():
            raise PluginFailed(label, f"no answer within {hung.limit_s:g}s, and that call is still running")  # type: ignore[attr-defined]
        self._hung.pop(label, None)

    def worker_cpu(self) -> float:
        """CPU seconds that this thread's calls have spent on pool threads, and their child
        workers (:class:`arbiter.plugin.ChildWorker`), so far (a call still running past its
        timeout is not counted): with ``time.thread_time()`` of the caller, what one piece
        of work cost, whatever else the process was doing."""
        return float(getattr(self._spent, "cpu", 0.0))

    def close_scratch(self, scratch: dict[str, Any], label: str = "process table") -> None:
        """Close what plugins kept in a scratch dict (see ``arbiter_process_table``), each
        under a timeout, and empty it; a plugin that fails to close is ignored."""
        for key, value in list(scratch.items()):
            close = getattr(value, "close", None)
            if callable(close):
                try:
                    self.call(f"{label} close ({key})", close, timeout=2)
                except PluginFailed:
                    pass
        scratch.clear()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def _distribution(host: PluginHost, plugin: object) -> str:
    for registered, distinfo in host.pm.list_plugin_distinfo():
        if registered is plugin:
            return f"{distinfo.project_name} {distinfo.version}"
    return ""


def _collect(host: PluginHost) -> None:
    for family in FAMILIES:
        hook = getattr(host.pm.hook, f"arbiter_register_{family}")
        for impl in hook.get_hookimpls():
            plugin_name = impl.plugin_name
            dist = _distribution(host, impl.plugin)

            def register(
                name: str, cls: type, _plugin: str = plugin_name, _dist: str = dist, _family: str = family
            ) -> None:
                if not isinstance(cls, type) or not issubclass(cls, FAMILIES[_family]):
                    raise PluginLoadError(
                        f"plugin {_plugin} registered {_family} kind {name!r} with {cls!r}, which is not a "
                        f"subclass of arbiter.plugin.{FAMILIES[_family].__name__}"
                    )
                options = getattr(cls, "Options", None)
                if not (isinstance(options, type) and issubclass(options, BaseModel)):
                    raise PluginLoadError(f"plugin {_plugin}: {_family} kind {name!r} has no pydantic Options model")
                existing = host.kinds.setdefault(_family, {}).get(name)
                if existing is not None:
                    raise PluginLoadError(
                        f"{_family} kind {name!r} is registered by both {existing.plugin} and {_plugin}; "
                        f"disable one of them with disable_plugins in arbiter.yaml"
                    )
                host.kinds[_family][name] = KindInfo(_family, name, cls, _plugin, _dist)

            impl.function(register=register)
    for impl in host.pm.hook.arbiter_register_node_sections.get_hookimpls():

        def register_section(
            name: str, model: type, _plugin: str = impl.plugin_name, _dist: str = _distribution(host, impl.plugin)
        ) -> None:
            if not isinstance(name, str) or not _SECTION_NAME.match(name):
                raise PluginLoadError(
                    f"plugin {_plugin} registered the node config section {name!r}: a section's name is lower-case "
                    "letters, digits and _, starting with a letter"
                )
            key = misspelling_of(name)
            if key is not None:
                raise PluginLoadError(
                    f"plugin {_plugin} registered the node config section {name!r}, "
                    + (
                        "a key arbiter has"
                        if key == name
                        else f"so close to arbiter's key {key!r} that it would be taken for it misspelt"
                    )
                )
            if not (isinstance(model, type) and issubclass(model, KindOptions)):
                raise PluginLoadError(
                    f"plugin {_plugin}: the node config section {name!r} has {model!r}, which is not a subclass of "
                    "arbiter.plugin.KindOptions"
                )
            existing = host.sections.get(name)
            if existing is not None:
                raise PluginLoadError(
                    f"the node config section {name!r} is registered by both {existing.plugin} and {_plugin}; "
                    "disable one of them with disable_plugins in arbiter.yaml"
                )
            host.sections[name] = SectionInfo(name, model, _plugin, _dist)

        impl.function(register=register_section)


def build_plugin_manager(
    modules: Iterable[str] = (),
    disable: Iterable[str] = (),
    entry_points: bool = True,
    timeout_s: float = 5.0,
    extra: Iterable[tuple[str, object]] = (),
) -> PluginHost:
    """A new plugin manager: installed entry points (group ``arbiter``), then ``modules``
    named in the node config, then ``extra`` (name, plugin) pairs; ``disable`` blocks any
    of them by name."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    blocked = set(disable)
    for name in blocked:
        pm.set_blocked(name)
    if entry_points:
        try:
            pm.load_setuptools_entrypoints(PROJECT)
        except Exception as exc:
            raise PluginLoadError(f"loading installed arbiter plugins failed: {type(exc).__name__}: {exc}") from exc
    for module_name in modules:
        if module_name in blocked:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginLoadError(
                f"plugin module {module_name!r} (named in plugins:) cannot be imported: {exc}"
            ) from exc
        if pm.get_plugin(module_name) is None:
            pm.register(module, name=module_name)
    for name, plugin in extra:
        if name not in blocked:
            pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(f"plugin {exc.plugin!r} implements a hook arbiter does not have: {exc}") from exc
    host = PluginHost(pm=pm, timeout_s=timeout_s, blocked=blocked)
    _collect(host)
    return host
