"""The daemon's collaborators, as the request side and the workers are handed them.

:class:`arbiter.daemon.core.Daemon` builds each collaborator once and hands this record to
the operations table (:mod:`arbiter.daemon.api`), the views, paired runs and scheduler
adoption.  It holds the collaborators themselves, never a forwarder: whoever reads a
collaborator's state reads it from the one that owns it, through that collaborator's own
thread-safe view (the published snapshot, a lock, a queue to its thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arbiter.daemon.inbox import JobsChanged

if TYPE_CHECKING:
    from arbiter.config.models import NodeConfig
    from arbiter.daemon.decider import Decider
    from arbiter.daemon.fleetcerts import FleetCerts
    from arbiter.daemon.handoff import TenantActions
    from arbiter.daemon.helpers import Helpers
    from arbiter.daemon.intake import Intake
    from arbiter.daemon.jobs import JobRegistry
    from arbiter.daemon.recorder import Recorder
    from arbiter.daemon.rules import RuleBook
    from arbiter.daemon.snapshot import Published, Snapshot
    from arbiter.daemon.ticker import Ticker
    from arbiter.pluginmanager import PluginHost
    from arbiter.probing import Prober
    from arbiter.reflex.act import Actuator
    from arbiter.state.journal import PausedJournal
    from arbiter.state.store import Store


@dataclass
class Parts:
    config: NodeConfig
    config_path: Path | None
    host: PluginHost
    state_dir: Path
    #: the daemon's own account
    uid: int
    started_wall: float
    token: str
    store: Store
    recorder: Recorder
    journal: PausedJournal
    actuator: Actuator
    jobs: JobRegistry
    rulebook: RuleBook
    prober: Prober
    published: Published
    intake: Intake
    decider: Decider
    ticker: Ticker
    tenants: TenantActions
    helpers: Helpers
    #: certificates shared with twin nodes through a folder
    fleet: FleetCerts

    @property
    def snapshot(self) -> Snapshot:
        """The last published snapshot (replaced whole by the decision thread)."""
        return self.published.snapshot

    def jobs_changed(self) -> None:
        """The job registry changed: the decision thread decides again now, not at the next tick."""
        self.decider.tell(JobsChanged())

    def costs(self) -> dict[str, Any]:
        """What the tick and the decisions cost, as the status shows it."""
        return {**self.ticker.costs, **self.decider.costs}
