"""What the daemon makes of the shared certificate folder on a read: a refusal remembered for
the certificate signed, whatever its file's layout; text from the folder escaped on the
timeline and in ``arbiter certificates``; a missing folder and one every account may write
reported, never read as empty or trusted silently."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

from arbiter.config.models import FleetCertificatesConfig
from arbiter.daemon.fleetcerts import FleetCerts
from arbiter.state import fleetcerts as files
from arbiter.state.certificates import Certificate, fingerprint

MACHINE = {"cpu_model": "X", "os": "linux 6"}
GPUS = ["G"]
BLOCKS = [(100.0, 100.2, True), (100.1, 99.9, False), (99.8, 100.0, True), (100.0, 100.1, False)]


class Twin:
    """A node B reading a folder node A publishes to; its daemon's collaborators are stand-ins
    holding what a read consults (the store's refusals, the program seen here) and what it
    does (paired runs started, timeline events)."""

    def __init__(self, root: Path) -> None:
        self.folder, state = root / "shared", root / "state"
        self.folder.mkdir(mode=0o755)
        state.mkdir(mode=0o700)
        self.key_a = files.load_key(files.new_key_text())
        config = FleetCertificatesConfig(
            folder=str(self.folder), node_name="B", trusted_keys={"A": files.public_text(self.key_a)}
        )
        self.runs: list[str] = []
        self.refused: dict[str, tuple[str, str]] = {}
        self.events: list[tuple[str, str, str, dict[str, Any]]] = []
        store: Any = NS(published_seen=dict, published_refused=lambda: self.refused, certificates=list)
        recorder: Any = NS(event=lambda *a: self.events.append(a), write=lambda fn: None)
        tenants: Any = NS(submit=lambda fn: threading.Thread(target=fn, daemon=True).start())
        view = NS(machine=MACHINE, gpus=GPUS, driver="", rules={"r": 1}, rule_exes={"r": "/bin/prog"})
        published: Any = NS(snapshot=NS(view=view))
        decider: Any = NS(engine_state=NS(ab=None))
        ticker: Any = NS(hasher=NS(digest=lambda exe: "ab" * 32), certificate_states=[])
        self.fc = FleetCerts(config, state, self.start, store, recorder, tenants, published, decider, ticker)

    def start(self, spec: Any) -> str:
        self.runs.append(spec.run_id)
        return ""

    def publish(self) -> Path:
        cert = Certificate(
            rule="r",
            work="gpu",
            duty=0.3,
            r=1.0,
            r_low=0.99,
            r_high=1.01,
            margin=0.05,
            run_id="s1",
            issued_at=time.time() - 60,
            node="A",
            fingerprint=fingerprint(MACHINE, GPUS),
            exe_path="/bin/prog",
            exe_sha256="ab" * 32,
        )
        return files.publish(self.folder, self.key_a, files.payload_of(cert, "A", BLOCKS, 0, time.time()))

    def shown(self) -> list[dict[str, Any]]:
        view = self.fc.view()
        assert view is not None
        return list(view["files"])


def test_a_refused_certificate_laid_out_again_starts_no_new_confirmation(tmp_path: Path) -> None:
    twin = Twin(tmp_path)
    path = twin.publish()
    twin.fc._scan()
    assert len(twin.runs) == 1  # a matching certificate starts a confirmation
    item = files.read(path, {"A": twin.key_a.public_key()}, {})
    assert isinstance(item, files.Published)
    twin.refused[item.digest] = ("FLEET_CERT_REFUSED", "inconclusive")  # as the confirmation's end keeps it
    # anyone who may write the folder lays the outer JSON out again: no key needed
    path.write_text(json.dumps(json.loads(path.read_text())) + " ")
    twin.runs.clear()
    twin.fc._scan()
    assert twin.runs == [] and twin.shown()[0]["status"] == "refused"


def test_names_from_the_folder_reach_the_timeline_and_the_view_escaped(tmp_path: Path) -> None:
    twin = Twin(tmp_path)
    (twin.folder / "\x1b[2J\x1b]0;PWN\x07\x9bevil.cert.json").write_text("x")
    twin.fc._scan()
    said = json.dumps(twin.events, ensure_ascii=False) + json.dumps(twin.shown(), ensure_ascii=False)
    assert twin.events and not any(c in said for c in "\x1b\x07\x9b")
    assert "\\x1b[2J\\x1b]0;PWN\\x07\\x9bevil.cert.json" in twin.events[0][2]
    assert twin.shown()[0]["file"] == "\\x1b[2J\\x1b]0;PWN\\x07\\x9bevil.cert.json"


def test_a_missing_folder_is_shown_unreadable_not_empty(tmp_path: Path) -> None:
    twin = Twin(tmp_path)
    twin.folder.rmdir()
    twin.fc._scan()
    (state,) = twin.shown()
    assert state["status"] == "unreadable" and str(twin.folder) in state["why"]


def test_a_folder_every_account_may_write_is_warned_of(tmp_path: Path) -> None:
    twin = Twin(tmp_path)
    twin.fc._scan()
    assert twin.shown() == []
    os.chmod(twin.folder, 0o777)
    twin.fc._scan()
    (state,) = twin.shown()
    assert state["status"] == "warning" and "writable by every account" in state["why"] and "chmod o-w" in state["why"]
