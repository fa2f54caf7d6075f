"""Certificates shared through a folder: a file published whole and signed, read back only
from a listed key, and refused with a reason when corrupt, cut short, signed by another key,
unlisted, copied under another node's name or put back older."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import ValidationError

from arbiter import __version__
from arbiter.config.models import NodeConfig
from arbiter.daemon.secure import ensure_secret
from arbiter.state import fleetcerts as files
from arbiter.state.certificates import Certificate

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
