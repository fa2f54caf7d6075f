"""``nfd``: what this node offers fleet schedulers, as a Kubernetes node-feature-discovery
local feature file.

NFD's ``local`` source reads ``/etc/kubernetes/node-feature-discovery/features.d/``: one
``name=value`` label per line, with a ``# +expiry-time=`` directive after which NFD drops
them (so a stopped daemon's labels go away on their own).  The file is written whole and
renamed into place (through a dotfile, which NFD ignores), so NFD never reads half of it.
Labels: ``arbiter-gpu-api-<api>=true`` per usable API (``arbiter-container-gpu-api-<api>``
for containers), ``arbiter-gpu-jobs-admitted=true|false``, ``arbiter-certified-duty-<rule>``.

Where the file goes: ``$ARBITER_NFD_FILE``, else the default below; nothing is written
while its folder does not exist (NFD is not installed).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from arbiter.plugin import hookimpl

DEFAULT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/arbiter"
FILE_ENV = "ARBITER_NFD_FILE"
#: labels outlive the daemon by this long at most (it rewrites them at least every minute)
EXPIRY_S = 600.0

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_MAX = 63  # a Kubernetes label name


def _label(prefix: str, part: str) -> str:
    """``prefix`` + ``part`` as a valid label name: alphanumeric at both ends, at most 63
    characters; one shortened gets a hash of the whole, so two never collide."""
    name = prefix + _UNSAFE.sub("_", part)
    if len(name) > _NAME_MAX:
        digest = hashlib.sha256(part.encode()).hexdigest()[:8]
        name = name[: _NAME_MAX - 9] + "-" + digest
    return name.rstrip("_.-") or prefix.rstrip("-")


def render(state: dict[str, Any], now: float) -> str:
    """The feature file for ``state`` (see the ``arbiter_node_state`` hook)."""
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + EXPIRY_S))
    apis = state.get("gpu_apis") or {}  # None until the probes have answered: no API labels yet
    labels = {_label("arbiter-gpu-api-", api): "true" for api in apis.get("host", [])}
    labels.update({_label("arbiter-container-gpu-api-", api): "true" for api in apis.get("containers", [])})
    labels["arbiter-gpu-jobs-admitted"] = "true" if state.get("gpu_jobs_admitted") else "false"
    for rule, duty in state.get("certified_duty", {}).items():
        labels[_label("arbiter-certified-duty-", rule)] = f"{float(duty):.2f}"
    return f"# +expiry-time={expiry}\n" + "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def write_atomically(path: Path, text: str) -> bool:
    """Replace ``path`` whole; False (nothing written) while its folder does not exist."""
    if not path.parent.is_dir():
        return False
    tmp = path.parent / f".{path.name}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


@hookimpl
def arbiter_node_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """Write the file; the labels written, for status and metrics (None where NFD is not installed)."""
    path = Path(os.environ.get(FILE_ENV) or DEFAULT_FILE)
    text = render(state, float(state.get("at") or time.time()))
    if not write_atomically(path, text):
        return None
    labels = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {"scheduler": "nfd", "node": socket.gethostname().split(".", 1)[0], "labels": labels, "error": ""}
