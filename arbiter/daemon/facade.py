"""What the request side reads of the daemon and may ask of it.

The socket's request handlers, the status and explain views, paired runs, helper sessions,
tenant actions and the HTTP server name :class:`Node`, not the daemon's class: the daemon
(:class:`arbiter.daemon.core.Daemon`) builds them, so none of them imports the module that
builds it.  Everything here is read from the published snapshot or a collaborator's own
lock-free view; the only changes go through the methods, which hand them to the thread that
owns them.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from arbiter.config.models import NodeConfig
from arbiter.daemon.act import Actuator
from arbiter.daemon.inbox import RunChange
from arbiter.daemon.jobs import JobRegistry
from arbiter.daemon.observe import Observer
from arbiter.daemon.recorder import Recorder
from arbiter.daemon.rules import RuleBook
from arbiter.daemon.snapshot import Snapshot
from arbiter.daemon.sources import HelperKey, SlotKey, SourceBook
from arbiter.engine.types import EngineState, Policy, Release
from arbiter.plugin import SourceState
from arbiter.pluginmanager import PluginHost
from arbiter.probing import Prober
from arbiter.store import JobRecord, PausedJournal, Store


class Tenants(Protocol):
    """The tenant actions' state that views and paired runs read."""

    applied: set[str]
    release_failed: dict[str, dict[str, Any]]

    def submit(self, fn: Callable[[], None]) -> None: ...


class Sessions(Protocol):
    """The helper sessions, as status shows them."""

    def view(self) -> list[dict[str, Any]]: ...


class Node(Protocol):
    config: NodeConfig
    config_path: Path | None
    host: PluginHost
    state_dir: Path
    uid: int
    started_wall: float
    http_url: str
    token: str
    store: Store
    recorder: Recorder
    journal: PausedJournal
    actuator: Actuator
    jobs: JobRegistry
    rulebook: RuleBook
    prober: Prober

    @property
    def tenants(self) -> Tenants: ...
    @property
    def helpers(self) -> Sessions: ...
    @property
    def snapshot(self) -> Snapshot: ...
    @property
    def sources(self) -> SourceBook: ...
    @property
    def observer(self) -> Observer: ...
    @property
    def engine_state(self) -> EngineState: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def costs(self) -> dict[str, Any]: ...
    @property
    def certificate_states(self) -> list[dict[str, Any]]: ...
    @property
    def hasher(self) -> Any: ...

    def record(self, code: str, subject: str, message: str, data: dict[str, Any] | None = None) -> None: ...
    def node_state(self) -> dict[str, Any]: ...
    def scheduler_labels(self) -> list[dict[str, Any]]: ...
    def node_fingerprint(self) -> dict[str, Any]: ...
    def certificates_changed(self) -> None: ...
    def end_job(self, record: JobRecord, exit_code: int | None, why: str) -> None: ...
    def notify_jobs(self) -> None: ...
    def request_reload(self) -> None: ...
    def release_over(self, release: Release, failed: bool) -> None: ...
    def change_run(self, change: RunChange) -> Future[Any]: ...
    def profiles_applied(self) -> set[str]: ...
    def action_failures(self) -> list[tuple[str, str]]: ...
    def on_helper(self, helper: HelperKey, key: SlotKey, state: SourceState) -> None: ...
    def helper_gone(self, helper: HelperKey) -> None: ...
    def latency_figures(self) -> dict[str, Any]: ...
