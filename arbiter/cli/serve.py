"""Running the daemon in the foreground, and resuming what a dead one left paused."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from pathlib import Path

from arbiter.api.transport import DaemonUnavailable, request
from arbiter.cli import discovery
from arbiter.cli.client import CliError
from arbiter.cli.signal_relay import relay_signals
from arbiter.config.models import NodeConfig
from arbiter.daemon.core import DAEMON_FILE, SOCKET_FILE, Daemon, DaemonAlreadyRunning
from arbiter.daemon.notify import Notifier
from arbiter.daemon.secure import UnsafeStateDir, check_recorded_state
from arbiter.daemon.views import status_line
from arbiter.pluginmanager import PluginLoadError, build_plugin_manager
from arbiter.reflex.act import Actuator, make_translators
from arbiter.reflex.limits import cap_malloc_arenas, raise_open_file_limit
from arbiter.runtime.children import UMASK
from arbiter.state.journal import PausedJournal
from arbiter.state.store import Store

#: how long stopping may take, at most, before the process ends anyway
STOP_MOST_S = 15.0


def _running_daemon(cfg: NodeConfig) -> str | None:
    if not (cfg.state_path() / DAEMON_FILE).exists():
        return None
    try:
        request(cfg.state_path() / SOCKET_FILE, "ping", timeout=2)
    except DaemonUnavailable:
        return None  # a stale file left by a killed daemon
    return str(cfg.state_path())


def refuse_a_second_daemon(cfg: NodeConfig) -> None:
    """Checked before anything else at start-up: a second daemon on the same state_dir would
    first meet what the first holds (its port, its lock), and say that instead."""
    if _running_daemon(cfg):
        raise CliError(f"a daemon already runs with state_dir {cfg.state_path()}; `arbiter status` shows it")


def serve(cfg: NodeConfig, config_path: Path | None) -> int:
    os.umask(UMASK)  # before anything is made: a mask of 0000 would leave it writable by everyone
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    refuse_a_second_daemon(cfg)
    cap_malloc_arenas()  # before any thread, each of which would take an arena
    raised = raise_open_file_limit()  # before the plugins, which size what they keep open by it
    if raised is not None:
        logging.getLogger("arbiter").info("open-file limit raised from %d to %d", *raised)
    # no child, and no path the daemon opens, may depend on the folder it was started in
    config_path = config_path.absolute() if config_path is not None else None
    os.chdir("/")
    try:
        daemon = Daemon(cfg, config_path)
    except PluginLoadError as exc:
        raise CliError(str(exc), 2) from None
    except (DaemonAlreadyRunning, UnsafeStateDir) as exc:
        raise CliError(str(exc)) from None
    daemon.ticker.notifier = notifier = Notifier.from_environ(os.environ)
    if notifier.interval_s is not None and notifier.interval_s < cfg.tick_s + cfg.plugin_timeout_s:
        logging.getLogger("arbiter").warning(
            "the watchdog wants a ping every %.1fs but a tick may take %.1fs (tick_s + plugin_timeout_s); "
            "give the service manager a watchdog timeout of at least %.0fs",
            notifier.interval_s,
            cfg.tick_s + cfg.plugin_timeout_s,
            4 * (cfg.tick_s + cfg.plugin_timeout_s),
        )

    relay_signals(
        {signal.SIGINT: daemon.request_stop, signal.SIGTERM: daemon.request_stop, signal.SIGHUP: daemon.ticker.reload}
    )
    daemon.start()
    pointer = discovery.publish(daemon.state_dir, daemon.state_dir / SOCKET_FILE, config_path)
    logging.getLogger("arbiter").info(
        "arbiter running: socket %s, http %s, %d rule(s)",
        daemon.state_dir / SOCKET_FILE,
        daemon.http_url or "off",
        len(daemon.rulebook.live),
    )
    # What start-up made (modules, plugins, config) lives as long as the process: out of
    # the collector's sight, a full collection, which holds every thread and so the fast
    # path, has that much less to walk.
    gc.freeze()
    notifier.ready(f"serving on {daemon.state_dir / SOCKET_FILE}: {status_line(daemon.parts)}")
    try:
        # no timeout: a signal reaches the relay whichever thread the kernel gives it to
        # (see arbiter.cli.signal_relay), so this thread sleeps until a stop instead of
        # waking every second
        while not daemon.wait():
            pass
    finally:
        leave_in_time(STOP_MOST_S)
        discovery.withdraw(pointer)
        notifier.stopping()
        daemon.shutdown()
        notifier.close()
    return 0


def leave_in_time(most_s: float) -> None:
    """End this process ``most_s`` from now however far stopping has come: a plugin's call
    that never returns (a source reading without end, a hung close) must not keep a stopped
    daemon alive.  What it paused was journalled before the pause; a daemon that starts next
    resumes whatever this one could not."""

    def leave() -> None:
        stuck = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive())
        logging.getLogger("arbiter").warning(
            "stopping took over %.0fs; leaving now (threads still running: %s)", most_s, ", ".join(stuck) or "none"
        )
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(most_s, leave)
    timer.daemon = True
    timer.start()


def resume_recorded(cfg: NodeConfig) -> tuple[int, list[str], list[str]]:
    """Resume every process and control document recorded as paused; (count, failures,
    what was left alone because its pid now names another process)."""
    state = cfg.state_path()
    db = state / "state.db"
    journal_path = state / "paused.journal"
    if not db.exists() and not journal_path.exists():
        return 0, [], []
    if _running_daemon(cfg):
        raise CliError("a daemon is running and resumes what it paused when it stops; stop it instead")
    try:
        check_recorded_state(state)  # its rows name processes to signal and files to write
    except UnsafeStateDir as exc:
        raise CliError(str(exc)) from None
    store = Store(db)
    try:
        entries = {**{e.key: e for e in store.paused()}, **PausedJournal.replay(journal_path)}
        if not entries:
            return 0, [], []
        try:
            host = build_plugin_manager(cfg.plugins, cfg.disable_plugins)
        except PluginLoadError as exc:
            raise CliError(str(exc), 2) from None
        journal = PausedJournal(journal_path)
        reused: list[str] = []
        translators = make_translators(cfg, host, lambda job_id, ref, why: reused.append(why))
        actuator = Actuator(host, translators, journal, lambda op, entries: None)
        failures = actuator.resume_entries(list(entries.values()))
        if not failures:
            store.clear_paused()
            with store.transaction() as conn:  # every job runs again: no protection pause goes on
                Store.put_held(conn, {})
            journal.truncate()
        journal.close()
        host.close()
        return len(entries), failures, reused
    finally:
        store.close()
