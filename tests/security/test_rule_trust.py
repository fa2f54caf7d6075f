"""A rule file another account may change gets from the root daemon only what that account
could do by itself: a rule with request headers (a credential), a release or a GPU profile
loads only from a file and folders root or the daemon's user alone can change."""

from __future__ import annotations

import json
import os
from pathlib import Path

from arbiter_testing import RecordingServer, run_as
from arbiter_testing.node import HarnessNode

from .conftest import needs_root

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
