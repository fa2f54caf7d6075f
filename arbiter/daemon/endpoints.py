"""Request headers and actions go only to the program a rule matched.

A rule's busy probe may carry a credential in a header, and its release asks a program to
unload.  Whatever answers at the rule's URL gets them: while the real program is down, any
local account may bind its port (and start a process the rule's ``match`` selects).  So
right before each such request the daemon asks who owns the socket listening there
(``arbiter_listeners``) and sends only when that user runs the rule's program now, and,
for a secret, could read the secret itself (root, or the owner of its ``from_file``).
Otherwise the request is not sent: the plugin reports why (a busy probe reads unknown, a
release fails) and the timeline says it once per rule, URL and reason.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from arbiter.daemon.snapshot import Published
from arbiter.engine import codes
from arbiter.plugin import SecretRef
from arbiter.pluginmanager import PluginFailed, PluginHost

log = logging.getLogger(__name__)

Record = Callable[[str, str, str, dict[str, object]], None]
#: how many refusals the daemon remembers having said (one line on the timeline each)
SAID_MOST = 256


def secret_readers(headers: Mapping[str, str | SecretRef], daemon_uid: int) -> frozenset[int] | None:
    """Who could read these headers' secrets without the daemon (None: no secret in them).
    A value written in the rule file, or one from the daemon's environment, only root and
    the daemon's user; one from a file, also that file's owner."""
    if not headers:
        return None
    readers = {0, daemon_uid}
    files = [v.from_file for v in headers.values() if isinstance(v, SecretRef) and v.from_file is not None]
    if len(files) == len(headers):  # every value from a file: whoever owns them all
        owners = set()
        for path in files:
            try:
                owners.add(os.stat(path).st_uid)
            except OSError:
                return frozenset(readers)
        if len(owners) == 1:
            readers |= owners
    return frozenset(readers)


def _addresses(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
    except (OSError, UnicodeError):
        return []


class Endpoints:
    def __init__(self, host: PluginHost, published: Published, record: Record, daemon_uid: int) -> None:
        self.host = host
        self.published = published
        self.record = record
        self.daemon_uid = daemon_uid
        self._said: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def for_rule(self, rule_id: str) -> Callable[[str, Mapping[str, str | SecretRef]], str | None]:
        return lambda url, headers: self.refused(rule_id, url, headers)

    def refused(self, rule_id: str, url: str, headers: Mapping[str, str | SecretRef]) -> str | None:
        """Why ``url`` gets neither these headers nor an action for ``rule_id`` now (None: it may)."""
        why = self._why(rule_id, url, headers)
        if why is not None and self.published.snapshot.view is not None:
            self._say(rule_id, url, why)  # before the first look at the processes, nothing is known to say
        return why

    def _why(self, rule_id: str, url: str, headers: Mapping[str, str | SecretRef]) -> str | None:
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return f"{url} has no valid port"
        view = self.published.snapshot.view
        runs = view.rule_uids.get(rule_id, frozenset()) if view is not None else frozenset()
        readers = secret_readers(headers, self.daemon_uid)
        for address in _addresses(parts.hostname or ""):
            try:
                found = self.host.call(
                    "listeners", lambda a=address: self.host.hook.arbiter_listeners(address=a, port=port)
                )
            except PluginFailed as exc:
                return f"cannot tell who listens at {address}:{port}: {exc}"
            if found is None:
                return f"no plugin can tell who listens at {address}:{port} (is the host plugin enabled?)"
            for sock in found:
                uid = int(sock["uid"])
                if uid not in runs:
                    users = ", ".join(str(u) for u in sorted(runs)) or "none: it is not running"
                    return (
                        f"the socket listening at {sock['address']}:{port} belongs to uid {uid}, which does not run "
                        f"rule {rule_id!r}'s program (its users: {users}); nothing is sent to it"
                    )
                if readers is not None and uid not in readers:
                    return (
                        f"the socket listening at {sock['address']}:{port} belongs to uid {uid}, which could not "
                        "read the rule's header secret itself; the secret is not sent (run the program as root, the "
                        "daemon's user or the owner of the secret's file, or give the file to its user)"
                    )
        return None  # nothing here listens there: another host, or the program is down (the request fails)

    def _say(self, rule_id: str, url: str, why: str) -> None:
        key = (rule_id, url, why.split(";")[0])
        with self._lock:
            if key in self._said:
                return
            if len(self._said) >= SAID_MOST:
                self._said.clear()
            self._said.add(key)
        log.warning("rule %s: not sending to %s: %s", rule_id, url, why)
        self.record(codes.ENDPOINT_REFUSED, rule_id, f"not sent to {url}: {why}", {"url": url})
