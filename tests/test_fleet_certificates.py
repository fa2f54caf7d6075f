"""Certificates shared through a folder: a file published whole and signed, read back only
from a listed key, and refused with a reason when corrupt, cut short, signed by another key,
unlisted, copied under another node's name or put back older."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import ValidationError

from arbiter import __version__
from arbiter.config.models import NodeConfig
from arbiter.daemon.secure import ensure_secret
from arbiter.state import fleetcerts as files
from arbiter.state.certificates import Certificate
from arbiter_testing import wait_until

NODE = {"cpu": "AMD EPYC", "gpus": ["NVIDIA H200"], "os": "linux 6", "arbiter": __version__}
BLOCKS = [(100.0, 101.0, True), (99.0, 100.0, False), (100.5, 100.0, True), (98.0, 99.5, False)]


def cert(issued_at: float = 1000.0) -> Certificate:
    return Certificate(
        rule="trainer",
        work="gpu",
        duty=0.35,
        r=0.995,
        r_low=0.985,
        r_high=1.004,
        margin=0.02,
        run_id="sweep-1",
        issued_at=issued_at,
        node="gpu-01",
        fingerprint=NODE,
        exe_path="/opt/trainer/bin/train",
        exe_sha256="ab" * 32,
    )


def publish(folder: Path, key: Ed25519PrivateKey, node: str = "gpu-01", issued_at: float = 1000.0) -> Path:
    return files.publish(folder, key, files.payload_of(cert(issued_at), node, BLOCKS, 0, 2000.0))


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return files.load_key(files.new_key_text())


def trust(key: Ed25519PrivateKey, node: str = "gpu-01") -> dict[str, Ed25519PublicKey]:
    return {node: files.public_key(files.public_text(key))}


def test_a_published_certificate_reads_back_whole_and_leaves_no_temporary_file(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    path = publish(tmp_path, key)
    assert path.name == "gpu-01.trainer.gpu.cert.json" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    got = files.read(path, trust(key), {})
    assert isinstance(got, files.Published), got
    assert (
        got.payload.certificate.duty == 0.35
        and got.payload.blocks == BLOCKS
        and got.key == ("gpu-01", "trainer", "gpu")
    )
    publish(tmp_path, key, issued_at=3000.0)  # replaced whole by rename
    again = files.read(path, trust(key), {})
    assert isinstance(again, files.Published) and again.payload.certificate.issued_at == 3000.0


@pytest.mark.parametrize(
    ("spoil", "code", "said"),
    [
        (lambda raw: raw[: len(raw) // 2], "FLEET_CERT_CORRUPT", "does not parse"),
        (lambda raw: b"", "FLEET_CERT_CORRUPT", "does not parse"),
        (lambda raw: raw.replace(b"0.35", b"0.95"), "FLEET_CERT_CORRUPT", "signature does not verify"),
        (lambda raw: b"\xff\xfe not text", "FLEET_CERT_CORRUPT", "does not parse"),
    ],
)
def test_a_corrupt_or_truncated_file_is_refused_with_its_reason(
    tmp_path: Path, key: Ed25519PrivateKey, spoil: object, code: str, said: str
) -> None:
    path = publish(tmp_path, key)
    path.write_bytes(spoil(path.read_bytes()))  # type: ignore[operator]
    got = files.read(path, trust(key), {})
    assert isinstance(got, files.Refused) and got.code == code and said in got.why, got


def test_only_a_listed_key_is_trusted(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = publish(tmp_path, key)
    unlisted = files.read(path, trust(key, node="gpu-02"), {})
    assert isinstance(unlisted, files.Refused) and unlisted.code == "FLEET_CERT_UNTRUSTED"
    assert "'gpu-01'" in unlisted.why and "trusted_keys" in unlisted.why
    other = files.load_key(files.new_key_text())  # the node's name listed, with another key
    forged = files.read(path, trust(other), {})
    assert isinstance(forged, files.Refused) and forged.code == "FLEET_CERT_CORRUPT" and "another key" in forged.why


def test_a_copy_under_another_name_or_an_older_copy_is_a_replay(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = publish(tmp_path, key)
    copy = tmp_path / files.file_name("gpu-02", "trainer", "gpu")
    copy.write_bytes(path.read_bytes())
    got = files.read(copy, {**trust(key), "gpu-02": files.public_key(files.public_text(key))}, {})
    assert isinstance(got, files.Refused) and got.code == "FLEET_CERT_REPLAYED" and "copy" in got.why
    older = files.read(path, trust(key), {("gpu-01", "trainer", "gpu"): 5000.0})
    assert isinstance(older, files.Refused) and older.code == "FLEET_CERT_REPLAYED" and "older" in older.why
    assert isinstance(files.read(path, trust(key), {("gpu-01", "trainer", "gpu"): 1000.0}), files.Published)


def test_a_scan_reads_every_file_but_the_nodes_own(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    publish(tmp_path, key, node="gpu-01")
    publish(tmp_path, key, node="gpu-02")
    (tmp_path / ".gpu-03.trainer.gpu.cert.json.1234.tmp").write_text("half")
    found = files.scan(tmp_path, trust(key), {}, own="gpu-02")
    assert [f.path.name for f in found] == ["gpu-01.trainer.gpu.cert.json"]


def test_the_signing_key_is_kept_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "signing.key"
    first = ensure_secret(path, files.new_key_text, "the signing key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_secret(path, files.new_key_text, "the signing key") == first
    path.chmod(0o644)  # others may have read it: a new one replaces it
    assert ensure_secret(path, files.new_key_text, "the signing key") != first
    files.load_key(first)


def test_a_listed_key_that_is_not_one_is_a_config_error(key: Ed25519PrivateKey) -> None:
    NodeConfig(fleet_certificates={"folder": "/shared", "trusted_keys": {"gpu-01": files.public_text(key)}})
    with pytest.raises(ValidationError, match="the key listed for 'gpu-01' is 3 bytes"):
        NodeConfig(fleet_certificates={"folder": "/shared", "trusted_keys": {"gpu-01": "AAAA"}})
    with pytest.raises(ValidationError, match="not base64"):
        NodeConfig(fleet_certificates={"folder": "/shared", "trusted_keys": {"gpu-01": "not a key!"}})


def test_the_file_holds_the_exact_text_signed(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    outer = json.loads(publish(tmp_path, key).read_text())
    assert set(outer) == {"payload", "signature"} and json.loads(outer["payload"])["node"] == "gpu-01"


def test_a_file_nesting_too_deeply_is_corrupt_and_the_others_are_still_read(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    (tmp_path / "a.trainer.gpu.cert.json").write_text("[" * 200_000)
    good = publish(tmp_path, key)
    deep, read = files.scan(tmp_path, trust(key), {}, "gpu-07")
    assert isinstance(deep, files.Refused) and deep.code == "FLEET_CERT_CORRUPT" and "nests" in deep.why
    assert isinstance(read, files.Published) and read.path == good


def test_a_fifo_a_link_or_an_oversized_file_is_refused_without_waiting(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """Opening a FIFO for reading waits for a writer: the scan must not, nor follow a link out
    of the folder, nor read a file no certificate could be."""
    os.mkfifo(tmp_path / "a.trainer.gpu.cert.json")
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"payload": "{}", "signature": ""}))
    (tmp_path / "b.trainer.gpu.cert.json").symlink_to(secret)
    with open(tmp_path / "c.trainer.gpu.cert.json", "wb") as fh:
        fh.truncate(files.MAX_BYTES + 1)
    (tmp_path / "d.trainer.gpu.cert.json").mkdir()
    publish(tmp_path, key)
    done: list[list[files.Published | files.Refused]] = []
    threading.Thread(target=lambda: done.append(files.scan(tmp_path, trust(key), {}, "gpu-07")), daemon=True).start()
    wait_until(lambda: done, timeout_s=10, what="the scan to return")
    *refused, good = done[0]
    assert [x.code for x in refused if isinstance(x, files.Refused)] == ["FLEET_CERT_CORRUPT"] * 4
    fifo, link, big, folder = (x.why for x in refused if isinstance(x, files.Refused))
    assert "regular" in fifo and "symbolic link" in link and "over" in big and "regular" in folder
    assert isinstance(good, files.Published)


def test_a_refusal_is_kept_for_what_was_signed_however_the_file_is_laid_out(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    """Anyone who may write the folder may lay the outer JSON out again without the key: the
    same signed certificate keeps its digest, so a refusal of it stays remembered."""
    path = publish(tmp_path, key)
    before = files.read(path, trust(key), {})
    path.write_text(json.dumps(json.loads(path.read_text())) + "  \n")
    after = files.read(path, trust(key), {})
    assert isinstance(before, files.Published) and isinstance(after, files.Published)
    assert after.digest == before.digest


def test_a_missing_folder_is_an_error_not_an_empty_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.scan(tmp_path / "not-mounted", {}, {}, "gpu-07")


def test_a_signing_key_that_is_not_one_stops_the_start_saying_which_file(tmp_path: Path) -> None:
    from arbiter.config.models import FleetCertificatesConfig
    from arbiter.daemon.fleetcerts import KEY_FILE, FleetCerts
    from arbiter.daemon.secure import UnsafeStateDir

    ensure_secret(tmp_path / KEY_FILE, lambda: "zz" * 32, "the signing key")
    config = FleetCertificatesConfig(folder=str(tmp_path), trusted_keys={})
    none: Any = None
    with pytest.raises(UnsafeStateDir, match=f"{tmp_path / KEY_FILE} is not a signing key: it is not hex; remove it"):
        FleetCerts(config, tmp_path, none, none, none, none, none, none, none)
