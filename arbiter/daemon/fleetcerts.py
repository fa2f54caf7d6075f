"""Certificates shared with twin nodes: publishing those earned here, and confirming then
adopting those a twin earned (:mod:`arbiter.state.fleetcerts` reads and writes the files,
:mod:`arbiter.engine.abconfirm` judges a confirmation).

The folder is read on a worker thread every ``scan_every_s`` (a network mount may be slow);
a published certificate whose fingerprint matches in every part starts a confirmation run
(a paired run of the daemon's own, at the certificate's duty) when no run is in progress; the
run's end adopts the certificate or refuses it.  What each file came to is kept for
``arbiter certificates``.
"""

from __future__ import annotations

import logging
import secrets
import socket
import stat
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from arbiter.api.text import escape_controls
from arbiter.config.models import FleetCertificatesConfig
from arbiter.daemon.secure import UnsafeStateDir, ensure_secret
from arbiter.engine import abconfirm, abrun, codes
from arbiter.engine.abstats import Block
from arbiter.state import fleetcerts as files
from arbiter.state.certificates import FINGERPRINT_PARTS, Certificate, fingerprint, part
from arbiter.state.store import Store

if TYPE_CHECKING:
    from arbiter.daemon.decider import Decider
    from arbiter.daemon.handoff import TenantActions
    from arbiter.daemon.recorder import Recorder
    from arbiter.daemon.snapshot import Published as Snapshots
    from arbiter.daemon.ticker import Ticker

log = logging.getLogger("arbiter.daemon")

KEY_FILE = "signing.key"
#: the parts of a fingerprint a published certificate must match here, beside its rule and program
MATCHED = FINGERPRINT_PARTS


def _shown(value: Any) -> Any:
    """Text from the shared folder (anyone who may write it chose it) with its control
    characters escaped; other values as they are."""
    return escape_controls(value) if isinstance(value, str) else value


def _writable_by_others(folder: Path) -> str:
    """Who beside the daemons' accounts may write the folder ("" where no one)."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return ""
    return "every account" if mode & stat.S_IWOTH else ""


def _signing_key(path: Path) -> Ed25519PrivateKey:
    """The key this node signs with, made on first use; one that is not a key stops the start."""
    text = ensure_secret(path, files.new_key_text, "the signing key")
    try:
        return files.load_key(text)
    except ValueError as exc:
        raise UnsafeStateDir(
            f"{path} is not a signing key: {exc}; remove it to make a new one at the next start "
            "(then list the new public key, shown by `arbiter certificates`, on the twins)"
        ) from None


class FleetCerts:
    """This node's side of the shared folder; inert where ``fleet_certificates`` is not set.

    :param start_run: starts a paired run, returning "" or why it cannot start now."""

    def __init__(
        self,
        config: FleetCertificatesConfig | None,
        state_dir: Path,
        start_run: Callable[[abrun.RunSpec], str],
        store: Store,
        recorder: Recorder,
        tenants: TenantActions,
        published: Snapshots,
        decider: Decider,
        ticker: Ticker,
    ) -> None:
        self.config = config
        self.start_run = start_run
        self.store, self.recorder, self.tenants = store, recorder, tenants
        self.published, self.decider, self.ticker = published, decider, ticker
        self.name = (config.node_name if config and config.node_name else "") or socket.gethostname()
        self.key = _signing_key(state_dir / KEY_FILE) if config else None
        self._lock = threading.Lock()
        self._states: dict[str, dict[str, Any]] = {}  # file name → what it came to (for `certificates`)
        self._pending: dict[str, files.Published] = {}  # file name → the version a confirmation runs for
        self._told: set[tuple[str, str]] = set()  # (file digest, code) already on the timeline
        self._scanning = False
        self._scanned_at = -float("inf")

    @property
    def public_key(self) -> str:
        return files.public_text(self.key) if self.key is not None else ""

    def view(self) -> dict[str, Any] | None:
        """What `arbiter certificates` shows of the folder (None where none is configured)."""
        if self.config is None:
            return None
        with self._lock:
            found = [dict(s) for _, s in sorted(self._states.items())]
        return {"folder": self.config.folder, "node": self.name, "public_key": self.public_key, "files": found}

    def _state(self, name: str, **state: Any) -> None:
        shown = {"file": name, **state}
        with self._lock:
            self._states[name] = {k: _shown(v) for k, v in shown.items()}

    def _event(self, code: str, subject: str, message: str, data: dict[str, Any]) -> None:
        """On the timeline: names and fields that came from the folder, escaped."""
        self.recorder.event(code, _shown(subject), _shown(message), {k: _shown(v) for k, v in data.items()})

    def _tell(self, digest: str, code: str, message: str, data: dict[str, Any]) -> None:
        """Each file version's outcome goes on the timeline once, not every scan."""
        with self._lock:
            if (digest, code) in self._told:
                return
            self._told.add((digest, code))
        self._event(code, "node", message, data)

    # --- publishing ------------------------------------------------------------------------

    def publish(self, cert: Certificate, run: abrun.RunState) -> None:
        """Put a certificate earned here in the shared folder (on a worker thread)."""
        if self.config is None or self.key is None or cert.origin:
            return
        blocks = [(b.on, b.off, b.on_first) for b in run.blocks]
        payload = files.payload_of(cert, self.name, blocks, abrun.pilot_of(run.spec), time.time())
        try:
            path = files.publish(Path(self.config.folder).expanduser(), self.key, payload)
        except OSError as exc:
            self._event(
                codes.FLEET_CERT_NOT_PUBLISHED,
                cert.rule,
                f"the certificate run {cert.run_id} earned could not be published to {self.config.folder}: "
                f"{exc.strerror or exc}",
                {"run": cert.run_id, "folder": self.config.folder, "remedy": "make the folder writable by the daemon"},
            )
            return
        self._event(
            codes.FLEET_CERT_PUBLISHED,
            cert.rule,
            f"the certificate run {cert.run_id} earned ({cert.work} work at duty {cert.duty:g}) is published as {path}",
            {"run": cert.run_id, "file": str(path)},
        )

    # --- reading and confirming ------------------------------------------------------------

    def tick(self) -> None:
        """On the tick: read the folder on a worker where a read is due and none runs."""
        if self.config is None:
            return
        now = time.monotonic()
        with self._lock:
            if self._scanning or now - self._scanned_at < self.config.scan_every_s:
                return
            self._scanning, self._scanned_at = True, now

        def scan() -> None:
            try:
                self._scan()
            except Exception:  # a worker's failure must not stop later reads
                log.exception("reading the fleet's certificates failed")
            finally:
                with self._lock:
                    self._scanning = False

        self.tenants.submit(scan)

    def rescan(self) -> None:
        """Read the folder at the next tick (a confirmation ended: the next may start)."""
        with self._lock:
            self._scanned_at = -float("inf")

    def _scan(self) -> None:
        assert self.config is not None
        trusted = {node: files.public_key(key) for node, key in self.config.trusted_keys.items()}
        seen = self.store.published_seen()
        refused = self.store.published_refused()
        adopted = {
            (c.origin, c.rule, c.work, c.issued_at) for c in self.store.certificates() if c.origin and not c.superseded
        }
        folder = Path(self.config.folder).expanduser()
        try:
            found = files.scan(folder, trusted, seen, self.name)
        except OSError as exc:
            self._state("", status="unreadable", why=f"{folder} cannot be read: {exc.strerror or exc}")
            return
        names = {item.path.name for item in found}
        with self._lock:  # a file taken out of the folder is no longer shown
            self._states = {name: state for name, state in self._states.items() if name in names}
        open_to = _writable_by_others(folder)
        if open_to:
            self._state(
                "",
                status="warning",
                why=f"{folder} is writable by {open_to}: any of them may leave files the daemon reads; "
                f"`chmod o-w {folder}` (only the daemons' accounts should write it)",
            )
        candidates: list[files.Published] = []
        for item in found:
            name = item.path.name
            if isinstance(item, files.Refused):
                self._state(name, status="refused", code=item.code, why=item.why)
                self._tell(item.digest, item.code, f"{name} in {folder} is refused: {item.why}", {"file": name})
                continue
            p, c = item.payload, item.payload.certificate
            self.recorder.write(
                partial(Store.saw_published, signer=p.node, rule=c.rule, work=c.work, issued_at=c.issued_at)
            )
            origin = {"node": p.node, "rule": c.rule, "work": c.work, "duty": c.duty}
            if (p.node, c.rule, c.work, c.issued_at) in adopted:
                self._state(name, status="adopted", **origin)
            elif item.digest in refused:
                code, why = refused[item.digest]
                self._state(name, status="refused", code=code, why=why, **origin)
            else:
                differs = self._differs(item)
                if differs == "":
                    candidates.append(item)
                elif differs is not None:
                    why = f"its fingerprint differs here: {differs}"
                    self._state(name, status="refused", code=codes.FLEET_CERT_MISMATCH, why=why, **origin)
                    self._tell(
                        item.digest,
                        codes.FLEET_CERT_MISMATCH,
                        f"{p.node}'s certificate for {c.rule!r} is not for this node: {why}",
                        {"file": name, **origin},
                    )
        self._confirm_next(candidates)

    def _differs(self, item: files.Published) -> str | None:
        """What differs between the certificate's fingerprint and this node's ("" where nothing
        does; None where it cannot be told yet, the program not running here)."""
        c = item.payload.certificate
        view = self.published.snapshot.view
        if view is None:
            return None
        current = fingerprint(view.machine, list(view.gpus), view.driver)
        if c.rule not in view.rules:
            return f"no rule {c.rule!r} is in force here"
        parts_differ = [
            f"{k} {part(c.fingerprint, k)!r} there, {part(current, k)!r} here"
            for k in MATCHED
            if part(c.fingerprint, k) != part(current, k)
        ]
        exe = view.rule_exes.get(c.rule)
        if exe is None:
            if parts_differ:
                return "; ".join(parts_differ)
            self._state(
                item.path.name,
                status="waiting",
                node=item.payload.node,
                rule=c.rule,
                why=f"{c.rule!r}'s program does not run here: its executable cannot be compared yet",
            )
            return None
        digest = self.ticker.hasher.digest(exe)
        if exe != c.exe_path:
            parts_differ.append(f"program {c.exe_path} there, {exe} here")
        elif digest is not None and digest != c.exe_sha256:
            parts_differ.append(f"program SHA-256 {c.exe_sha256[:12]}… there, {digest[:12]}… here")
        if digest is None and not parts_differ:
            return None
        return "; ".join(parts_differ)

    def _confirm_next(self, candidates: list[files.Published]) -> None:
        current = self.decider.engine_state.ab
        running = current is not None and current.running
        # what this node holds valid already: a twin's certificate at no higher duty adds nothing
        held: dict[tuple[str, str], float] = {}
        for cert in self.ticker.certificate_states:
            if cert["status"] == "valid":
                key = (cert["rule"], cert["work"])
                held[key] = max(held.get(key, 0.0), float(cert["duty"]))
        for item in candidates:
            name, p, c = item.path.name, item.payload, item.payload.certificate
            origin = {"node": p.node, "rule": c.rule, "work": c.work, "duty": c.duty}
            if running and current is not None and current.spec.confirms == name:
                self._state(name, status="confirming", run=current.spec.run_id, **origin)
                continue
            if held.get((c.rule, c.work), -1.0) >= c.duty:
                why = f"a valid certificate here already covers duty {held[(c.rule, c.work)]:g}"
                self._state(name, status="not needed", why=why, **origin)
                continue
            original = [Block(on, off, first) for on, off, first in p.blocks]
            n = abconfirm.blocks_for(original, c.margin)
            if n is None:
                why = "the original run's progress was too noisy for a realistic confirmation"
                self._refuse(item, why)
                continue
            if running:
                self._state(name, status="waiting", why="another paired run is in progress", **origin)
                continue
            assert self.config is not None
            run_id = f"confirm-{secrets.token_hex(3)}"
            spec = abrun.RunSpec(
                run_id=run_id,
                rule_id=c.rule,
                work=c.work,
                duty=c.duty,
                blocks=n,
                window_s=self.config.window_s,
                washout_s=self.config.washout_s,
                margin=c.margin,
                max_hours=self.config.max_hours,
                seed=run_id,
                pilot=0,
                confirms=name,
                origin=p.node,
            )
            with self._lock:
                self._pending[name] = item
            refused = self.start_run(spec)
            if refused:
                self._state(name, status="waiting", why=refused, **origin)
                continue
            running = True
            self._state(name, status="confirming", run=run_id, blocks=n, **origin)
            self._event(
                codes.FLEET_CERT_CONFIRMING,
                c.rule,
                f"confirming {p.node}'s certificate for {c.rule!r} ({c.work} work at duty {c.duty:g}) "
                f"with run {run_id} of {n} blocks",
                {"run": run_id, "file": name, "blocks": n, **origin},
            )

    def _refuse(self, item: files.Published, why: str) -> None:
        p, c = item.payload, item.payload.certificate
        name = item.path.name
        self._state(name, status="refused", code=codes.FLEET_CERT_REFUSED, why=why, node=p.node, rule=c.rule)
        self.recorder.write(lambda db: Store.refuse_published(db, item.digest, name, codes.FLEET_CERT_REFUSED, why))
        self._tell(
            item.digest,
            codes.FLEET_CERT_REFUSED,
            f"{p.node}'s certificate for {c.rule!r} ({c.work} work at duty {c.duty:g}) is refused: {why}",
            {"file": name, "node": p.node, "rule": c.rule, "work": c.work, "duty": c.duty},
        )

    def concluded(self, run: abrun.RunState) -> None:
        """A confirmation run ended (called on the decision thread): adopt or refuse."""
        self.tenants.submit(lambda: self._conclude(run))

    def _conclude(self, run: abrun.RunState) -> None:
        name = run.spec.confirms
        with self._lock:
            item = self._pending.pop(name, None)
        if item is None:  # a run resumed after a restart: read its file again
            assert self.config is not None
            trusted = {node: files.public_key(key) for node, key in self.config.trusted_keys.items()}
            read = files.read(Path(self.config.folder).expanduser() / name, trusted, self.store.published_seen())
            if isinstance(read, files.Refused):
                self._state(name, status="refused", code=read.code, why=read.why)
                return
            item = read
        self.rescan()
        c = item.payload.certificate
        if run.status != "done":  # aborted or refused: nothing was shown; the next read tries again
            self._state(name, status="waiting", why=f"confirmation run {run.spec.run_id} {run.status}: {run.why}")
            return
        if len(run.blocks) < 2:  # a collapse of progress ends a run early: a slowdown here
            self._refuse(item, f"confirmation run {run.spec.run_id} showed a slowdown: {run.why}")
            return
        blocks = [Block(b.on, b.off, b.on_first) for b in run.blocks]
        original = [Block(on, off, first) for on, off, first in item.payload.blocks]
        verdict = abconfirm.judge(original, c.r_low, c.r_high, blocks, c.margin)
        if not verdict.adopts:
            self._refuse(item, f"confirmation run {run.spec.run_id}: {verdict.why}")
            return
        if run.verdict == "slowdown":  # progress collapsed in a window its blocks leave out
            self._refuse(item, f"confirmation run {run.spec.run_id} showed a slowdown: {run.why}")
            return
        a = verdict.analysis
        cert = Certificate(
            rule=c.rule,
            work=c.work,
            duty=c.duty,
            r=a.r,
            r_low=a.low,
            r_high=a.high,
            margin=c.margin,
            run_id=run.spec.run_id,
            issued_at=c.issued_at,  # the evidence ages from when it was first earned
            node=self.name,
            fingerprint=dict(c.fingerprint),
            exe_path=c.exe_path,
            exe_sha256=c.exe_sha256,
            origin=item.payload.node,
            confirm_blocks=a.n,
        )

        def write(db: Any) -> None:
            cert_id = Store.insert_certificate(db, cert)
            self._event(
                codes.FLEET_CERT_ADOPTED,
                c.rule,
                f"certificate {cert_id}: {item.payload.node}'s certificate for {c.rule!r} ({c.work} work at duty "
                f"{c.duty:g}) is adopted: {verdict.why}",
                {"certificate": cert_id, "run": run.spec.run_id, "node": item.payload.node, "blocks": a.n},
            )
            self.ticker.certificates_changed()

        self.recorder.write(write)
        self._state(name, status="adopted", node=item.payload.node, rule=c.rule, work=c.work, duty=c.duty, blocks=a.n)
