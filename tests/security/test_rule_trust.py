"""A rule file another account may change gets from the root daemon only what that account
could do by itself: a rule with request headers (a credential), a release or a GPU profile
loads only from a file and folders root or the daemon's user alone can change."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from arbiter_testing import RecordingServer, run_as
from arbiter_testing.node import HarnessNode
from arbiter_testing.rules import phase_rule
from arbiter_testing.slurm import free_ports
from arbiter_testing.waiting import wait_until

from .conftest import Background, needs_root

NOBODY = 65534


def sneaky_rule(url: str) -> str:
    return (
        "id: sneaky\n"
        "match: {cmdline: ['sleep 1031']}\n"
        "busy:\n"
        f"  kind: http_count\n  url: {url}/internal\n  count_keys: [queue]\n  every_s: 0.2\n"
        "  headers: {X-Internal-Token: chosen-by-nobody}\n"
    )


def releasing_rule(url: str) -> str:
    return (
        "id: releasing\n"
        "match: {cmdline: ['sleep 1032']}\n"
        f"busy: {{kind: http_count, url: {url}/q, count_keys: [queue]}}\n"
        f"release: {{kind: http_post, url: {url}/release}}\n"
    )


def oracle_rule(secret: Path) -> str:
    """A pattern on a root-only file: its progress would say whether the file matches."""
    return (
        "id: oracle\n"
        "match: {cmdline: ['sleep 1034']}\n"
        f"protect: {{metric: progress_rate, source: {{kind: log, path: {secret}, log_regex: 'password=h'}}}}\n"
    )


@needs_root
def test_a_rule_file_nobody_may_change_gets_no_headers_and_no_releases(shared_root: Path) -> None:
    theirs = shared_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    secret = shared_root / "root-only"
    secret.write_text("password=hunter2\n")
    os.chmod(secret, 0o600)
    with RecordingServer(answer={"queue": []}) as server:

        def plant() -> None:
            (theirs / "sneaky.yaml").write_text(sneaky_rule(server.url))
            (theirs / "releasing.yaml").write_text(releasing_rule(server.url))
            (theirs / "oracle.yaml").write_text(oracle_rule(secret))

        run_as("nobody", plant)
        node = HarnessNode(shared_root / "node", tenants_dirs=[str(theirs)])
        node.start()
        try:
            rejected = node.events(code="CONFIG_REJECTED", contains="sends request headers")
            assert any(f"owned by uid {NOBODY}" in e["message"] for e in rejected), rejected
            node.events(code="CONFIG_REJECTED", contains="sends requests that change what a program does")
            node.events(code="CONFIG_REJECTED", contains="reads a file with the daemon's rights")
            loaded = {r["id"] for r in node.status()["rules"]}
            assert not loaded & {"sneaky", "releasing", "oracle"}, loaded
            assert not [s for s in server.seen if "x-internal-token" in {k.lower() for k in s.headers}]
        finally:
            node.close()


def test_a_secret_header_comes_from_a_file_and_is_never_stored_or_shown(tmp_path: Path) -> None:
    secret = "s3cret-token-" + os.urandom(8).hex()
    secret_file = tmp_path / "token"
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)
    with RecordingServer(answer={"queue": []}) as server:
        node = HarnessNode(tmp_path / "node")
        node.add_rule(
            "guarded",
            "id: guarded\nmatch: {cmdline: ['sleep 1033']}\n"
            f"busy: {{kind: http_count, url: {server.url}/q, count_keys: [queue], every_s: 0.2,\n"
            f"  headers: {{Authorization: {{from_file: {secret_file}}}}}}}\n",
        )
        node.start()
        try:
            node.spawn(["sleep", "1033"])  # the program the secret is for, listening as root as the server does
            node.wait_for(lambda: any(s.headers.get("Authorization") == secret for s in server.seen))
            shown = json.dumps([node.status(), node.call("explain"), node.call("timeline", limit=500)])
            assert secret not in shown
            node.call("reload")
        finally:
            node.close()
    for name in ("state.db", "state.db-wal"):
        path = node.state_dir / name
        if path.exists():
            assert secret.encode() not in path.read_bytes(), name


@needs_root
def test_a_secret_goes_only_to_a_socket_of_a_user_who_could_read_it(shared_root: Path) -> None:
    """While the real program is down, ``nobody`` binds its port and starts a process the rule
    matches: the root daemon sends the secret header to no one (before, every probe sent it
    to nobody's server) and says why on the timeline."""
    secret = "s3cret-token-" + os.urandom(8).hex()
    secret_file = shared_root / "token"
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)
    (port,) = free_ports(1)
    drop = shared_root / "drop"  # where nobody says it listens, and is told to stop
    drop.mkdir(mode=0o777)
    os.chmod(drop, 0o777)
    stop = drop / "stop"

    def listen() -> list[dict[str, str]]:
        with RecordingServer(answer={"queue": []}, port=port) as server:
            (drop / "listening").mkdir()
            while not stop.exists():
                time.sleep(0.05)
            return [dict(s.headers) for s in server.seen]

    attacker = Background("nobody", listen)
    lookalike = subprocess.Popen(["sleep", "1036"], user="nobody")
    node = HarnessNode(shared_root / "node")
    node.add_rule(
        "guarded",
        "id: guarded\nmatch: {cmdline: ['sleep 1036']}\n"
        f"busy: {{kind: http_count, url: 'http://127.0.0.1:{port}/q', count_keys: [queue], every_s: 0.2,\n"
        f"  headers: {{Authorization: {{from_file: {secret_file}}}}}}}\n",
    )
    try:
        wait_until(lambda: (drop / "listening").exists(), 30, "nobody's server listening")
        node.start()
        refused = node.events("ENDPOINT_REFUSED", "guarded", contains="could not read the rule's header secret")
        assert any("belongs to uid 65534" in e["message"] for e in refused), refused
        # explained where the rule's busy reading is shown
        node.wait_for(lambda: "could not read the rule's header secret" in json.dumps(node.known_rule("guarded")))
    finally:
        stop.mkdir()
        seen = attacker.join()
        lookalike.kill()
        lookalike.wait()
        node.close()
    assert not [h for h in seen if secret in json.dumps(h)], seen


@needs_root
def test_a_rule_file_others_may_change_never_weakens_a_root_rule_it_extends(shared_root: Path) -> None:
    """A tenants folder ``nobody`` may write holds ``extends: guarded`` with ``during: []``
    and ``protect: null``: after a reload root's rule still pauses fleet work during its
    phase (before, the extension replaced it with an unprotected rule)."""
    theirs = shared_root / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    node = HarnessNode(shared_root / "node")
    node.config["tenants_dirs"] = [str(node.tenants), str(theirs)]
    node.write_config()
    rule = phase_rule("guarded", "sleep 1037", str(shared_root / "phase.jsonl"), protect={"metric": "gpu_share"})
    node.add_rule("guarded", rule)
    node.start()
    try:
        before = node.known_rule("guarded")
        assert before["protected"] and before["sources"], before

        def weaken() -> None:
            (theirs / "weaker.yaml").write_text("id: weaker\nextends: guarded\nprotect: null\nduring: []\n")

        run_as("nobody", weaken)
        node.call("reload")
        refused = node.events(code="CONFIG_REJECTED", contains="may not change rule 'guarded'")
        assert any("weaker.yaml" in e["message"] for e in refused), refused
        after = node.known_rule("guarded")
        # the same phase source, still there (who last read it, the tick or its watcher, varies)
        sources = [[(s["slot"], s["kind"]) for s in rule["sources"]] for rule in (before, after)]
        assert after["protected"] and sources[0] == sources[1], after
        checked = node.cli("check", str(theirs / "weaker.yaml"))
        assert "may not change rule 'guarded'" in checked.stdout + checked.stderr, checked
    finally:
        node.close()
