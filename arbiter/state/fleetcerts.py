"""Certificates published to a folder every node of a fleet mounts, signed by the node that
earned them.

One file a node, rule and work: ``<node>.<rule>.<work>.cert.json``, holding the signed
payload (as the exact text signed) and its Ed25519 signature.  A node publishes by writing a
temporary file in the folder and renaming it over the old one, so a reader sees the old file
or the new one whole (network file systems rename atomically; no lock is assumed).

A reader trusts a file only where the node it names is listed with the key that signed it;
a file that does not parse, is cut short or fails its signature is corrupt; a copy of
another node's file, or an older copy put back, is a replay.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arbiter.state.certificates import Certificate

FORMAT = 1
SUFFIX = ".cert.json"
MAX_BYTES = 1 << 20  # a certificate with its blocks is a few kB; anything this large is not one
RefusalCode = Literal["FLEET_CERT_CORRUPT", "FLEET_CERT_UNTRUSTED", "FLEET_CERT_REPLAYED"]


def new_key_text() -> str:
    """A new signing key as the state directory keeps it: the private seed in hex."""
    return secrets.token_bytes(32).hex()


def load_key(text: str) -> Ed25519PrivateKey:
    """A kept signing key; ValueError saying what is wrong with it."""
    try:
        seed = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("it is not hex") from None
    if len(seed) != 32:
        raise ValueError(f"it is {len(seed)} bytes, not the 32 of an Ed25519 private key")
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_text(key: Ed25519PrivateKey) -> str:
    """The key the operator lists on the other nodes: the raw public key in base64."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def public_key(text: str) -> Ed25519PublicKey:
    """A listed key; ValueError saying what is wrong with it."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("it is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"it is {len(raw)} bytes, not the 32 of an Ed25519 public key")
    return Ed25519PublicKey.from_public_bytes(raw)


def _part(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", s) or "_"


def file_name(node: str, rule: str, work: str) -> str:
    return f"{_part(node)}.{_part(rule)}.{_part(work)}{SUFFIX}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PublishedCert(_Strict):
    rule: str
    work: str
    duty: float = Field(gt=0, le=1)
    r: float = Field(gt=0)
    r_low: float = Field(gt=0)
    r_high: float = Field(gt=0)
    margin: float = Field(gt=0, lt=1)
    run_id: str
    issued_at: float
    fingerprint: dict[str, Any]
    exe_path: str
    exe_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Payload(_Strict):
    format: Literal[1]
    name: str  # the file name it was published under: a copy under another is a replay
    node: str
    published_at: float
    certificate: PublishedCert
    blocks: list[tuple[float, float, bool]] = Field(min_length=2)  # (ON rate, OFF rate, ON first), all of the run's
    pilot: int = Field(ge=0)


@dataclass(frozen=True)
class Published:
    """A published certificate that reads, verifies and is no replay."""

    path: Path
    digest: str  # of the signed payload: a refusal is remembered for this version alone, however it is laid out
    payload: Payload

    @property
    def key(self) -> tuple[str, str, str]:
        c = self.payload.certificate
        return self.payload.node, c.rule, c.work


@dataclass(frozen=True)
class Refused:
    path: Path
    digest: str
    code: RefusalCode
    why: str


def payload_of(cert: Certificate, node: str, blocks: list[tuple[float, float, bool]], pilot: int, now: float) -> str:
    body = {
        "format": FORMAT,
        "name": file_name(node, cert.rule, cert.work),
        "node": node,
        "published_at": now,
        "certificate": {
            "rule": cert.rule,
            "work": cert.work,
            "duty": cert.duty,
            "r": cert.r,
            "r_low": cert.r_low,
            "r_high": cert.r_high,
            "margin": cert.margin,
            "run_id": cert.run_id,
            "issued_at": cert.issued_at,
            "fingerprint": dict(cert.fingerprint),
            "exe_path": cert.exe_path,
            "exe_sha256": cert.exe_sha256,
        },
        "blocks": [list(b) for b in blocks],
        "pilot": pilot,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def publish(folder: Path, key: Ed25519PrivateKey, payload: str) -> Path:
    """Sign ``payload`` and put it in ``folder`` under its name, whole or not at all."""
    name = str(json.loads(payload)["name"])
    signature = base64.b64encode(key.sign(payload.encode("utf-8"))).decode("ascii")
    text = json.dumps({"payload": payload, "signature": signature}, indent=1)
    final = folder / name
    tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def read(
    path: Path,
    trusted: Mapping[str, Ed25519PublicKey],
    seen: Mapping[tuple[str, str, str], float],
) -> Published | Refused:
    """One published file, checked: its shape, its signer among ``trusted`` (node → key), its
    signature, its name, and its age against the newest ``seen`` from that node."""
    try:
        raw = _read_regular(path)
    except OSError as exc:
        why = "it is a symbolic link: only a published file is read" if exc.errno == errno.ELOOP else None
        return Refused(path, "", "FLEET_CERT_CORRUPT", why or f"it cannot be read: {exc.strerror or exc}")
    except _NotAFile as exc:
        return Refused(path, "", "FLEET_CERT_CORRUPT", str(exc))
    digest = hashlib.sha256(raw).hexdigest()  # until the signed text is found: a file that has none

    def refused(code: RefusalCode, why: str) -> Refused:
        return Refused(path, digest, code, why)

    try:
        outer = json.loads(raw.decode("utf-8"))
        text, signature = outer["payload"], base64.b64decode(outer["signature"], validate=True)
        if not isinstance(text, str):
            raise TypeError("payload is not text")
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        unverified = json.loads(text)
        node = unverified["node"]
    except RecursionError:
        return refused("FLEET_CERT_CORRUPT", "it nests too deeply to be a signed certificate")
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, binascii.Error) as exc:
        return refused("FLEET_CERT_CORRUPT", f"it does not parse as a signed certificate (cut short?): {exc}")
    if not isinstance(node, str) or node not in trusted:
        return refused(
            "FLEET_CERT_UNTRUSTED",
            f"it names node {node!r}, whose key is not listed under fleet_certificates.trusted_keys",
        )
    try:
        trusted[node].verify(signature, text.encode("utf-8"))
    except InvalidSignature:
        return refused(
            "FLEET_CERT_CORRUPT",
            f"its signature does not verify with the key listed for {node!r}: it was changed after "
            "signing, or another key signed it",
        )
    try:
        payload = Payload.model_validate(unverified)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return refused("FLEET_CERT_CORRUPT", f"field {where}: {first['msg']}")
    if payload.name != path.name:
        return refused(
            "FLEET_CERT_REPLAYED",
            f"it is a copy: {node!r} published it as {payload.name}, not {path.name}",
        )
    c = payload.certificate
    newest = seen.get((node, c.rule, c.work))
    if newest is not None and c.issued_at < newest:
        return refused(
            "FLEET_CERT_REPLAYED",
            f"it is an older copy: {node!r} published a certificate for {c.rule!r} ({c.work} work) issued "
            f"{newest - c.issued_at:.0f}s after this one",
        )
    return Published(path, digest, payload)


def scan(
    folder: Path, trusted: Mapping[str, Ed25519PublicKey], seen: Mapping[tuple[str, str, str], float], own: str
) -> list[Published | Refused]:
    """Every published file in ``folder`` but this node's own, checked, in name order."""
    with os.scandir(folder) as entries:  # a missing or unreadable folder raises, as it must be reported
        names = sorted(e.name for e in entries if e.name.endswith(SUFFIX))
    return [read(folder / n, trusted, seen) for n in names if not n.startswith((".", f"{_part(own)}."))]


class _NotAFile(Exception):
    """What stands under a certificate's name is no regular file of a sane size."""


def _read_regular(path: Path) -> bytes:
    """The file's bytes, never following a link and never waiting: anyone who may write the
    folder may leave a link to a root-only file, a FIFO or a device under a certificate's name."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotAFile("it is not a regular file (a FIFO, device or folder): only a published file is read")
        if st.st_size > MAX_BYTES:
            raise _NotAFile(f"it is over {MAX_BYTES} bytes: no certificate is this large")
        chunks: list[bytes] = []
        left = MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > MAX_BYTES:  # it grew after the fstat
        raise _NotAFile(f"it is over {MAX_BYTES} bytes: no certificate is this large")
    return raw
