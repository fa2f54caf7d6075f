"""Session helpers: ``arbiter helper`` processes that read, in a user's login, the sources
the daemon's account may not read, and report only counts and phase states.

A helper opens a session (``helper.attach``) and is given the sources whose file lies in
its user's home (by the uid the socket reports, never by what the helper says; a home that
is ``/`` or not the uid's own gives none).  It then sends ``report`` lines for those sources
only, checked against the rules in force at that moment; nothing it sends is run, opened or
shown as file contents.  A report counts only while that user runs the rule's program, and
stops counting when the connection ends (fail safe).
"""

from __future__ import annotations

import itertools
import os
import pwd
import threading
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arbiter.daemon.sources import SlotKey
from arbiter.plugin import Phase, SourceState

if TYPE_CHECKING:
    from arbiter.daemon.intake import Intake
    from arbiter.daemon.rules import RuleBook
    from arbiter.pluginmanager import PluginHost

MAX_SESSIONS_PER_UID = 4
#: a report may say it saw a change at most this long ago (it is a latency, not a history)
MAX_REPORT_AGE_S = 60.0


def home_of(uid: int) -> tuple[str | None, str]:
    """(the uid's home, or None and why it has none a helper may speak for)."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None, f"uid {uid} is not in the user database"
    if not home or not os.path.isabs(home):
        return None, f"uid {uid} has no home folder"
    home = os.path.normpath(home)
    if home == "/":
        return None, f"the home of uid {uid} is / (a system account): it would cover every file"
    try:
        st = os.stat(home)
    except OSError as exc:
        return None, f"the home of uid {uid}, {home}, cannot be checked: {exc.strerror or exc}"
    if st.st_uid != uid:
        return None, f"the home of uid {uid}, {home}, is owned by uid {st.st_uid}"
    return home, ""


def path_in_home(raw: str, home: str) -> str | None:
    """``raw`` (``~/…`` meaning that home) as an absolute path, when it lies in ``home``."""
    if raw == "~" or raw.startswith("~/"):
        path = home + raw[1:]
    elif os.path.isabs(raw):
        path = raw
    else:
        return None  # ~otheruser/… or a relative path: never someone else's
    path = os.path.normpath(path)
    return path if path == home or path.startswith(home.rstrip("/") + "/") else None


class Report(BaseModel):
    """What a helper may say about one source: counts and phase states, nothing else."""

    model_config = ConfigDict(extra="forbid")
    rule: str
    index: int = Field(ge=-1)
    readable: bool
    count: int = Field(0, ge=0)
    rate: float | None = Field(None, ge=0)
    phase: Phase | None = None
    why: str = Field("", max_length=1000)
    needs_helper: bool = False
    changed_at: float = 0.0

    @field_validator("why")
    @classmethod
    def _one_printable_line(cls, value: str) -> str:
        # shown to every account in status: no terminal escape, no second line
        return "".join(c if c.isprintable() else " " for c in value)


class HelperSession:
    def __init__(self, helpers: Helpers, uid: int, home: str, number: int) -> None:
        self.helpers = helpers
        self.uid = uid
        self.home = home
        self.key = (uid, number)
        self.allowed: set[SlotKey] = set()
        self._allowed_at = -1  # the rules' generation `allowed` was computed for

    def _listing(self) -> list[dict[str, Any]]:
        generation = self.helpers.generation()
        listing = self.helpers.sources_for(self.home)
        self.allowed, self._allowed_at = {(s["rule"], s["index"]) for s in listing}, generation
        return listing

    def sources(self) -> dict[str, Any]:
        listing = self._listing()
        return {"ok": True, "generation": self._allowed_at, "home": self.home, "sources": listing}

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "sources":
            return self.sources()
        if op == "ping":
            return {"ok": True, "generation": self.helpers.generation()}
        if op != "report":
            return {
                "ok": False,
                "error": f"a helper session knows sources, ping and report, not {op!r}",
                "code": "BAD_REQUEST",
            }
        try:
            report = Report.model_validate(args)
        except ValidationError as exc:
            return {
                "ok": False,
                "error": f"bad report: {exc.errors(include_url=False)[0]['msg']}",
                "code": "BAD_REQUEST",
            }
        key = (report.rule, report.index)
        if self._allowed_at != self.helpers.generation():
            self._listing()  # the rules changed: a path may have left this home
        if key not in self.allowed:
            return {
                "ok": False,
                "error": f"{report.rule} {report.index} is not a source in the home of uid {self.uid}",
                "code": "REFUSED",
            }
        now = time.monotonic()
        changed_at = min(now, max(now - MAX_REPORT_AGE_S, report.changed_at)) if report.changed_at else now
        state = SourceState(
            readable=report.readable,
            count=report.count,
            rate=report.rate,
            phase=report.phase,
            why=report.why,
            changed_at=changed_at,
            needs_helper=report.needs_helper,
        )
        self.helpers.report(self.key, key, state)
        return {"ok": True, "generation": self.helpers.generation()}

    def close(self) -> None:
        self.helpers.gone(self)


class Helpers:
    """Opens and tracks helper sessions for the daemon's socket."""

    def __init__(self, host: PluginHost, rulebook: RuleBook, intake: Intake) -> None:
        self.host, self.rulebook, self.intake = host, rulebook, intake
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self.sessions: dict[tuple[int, int], HelperSession] = {}

    def generation(self) -> int:
        return self.rulebook.generation

    def sources_for(self, home: str) -> list[dict[str, Any]]:
        """Every file source of the rules in force whose path lies in ``home``."""
        out = []
        host = self.host
        for rid, live in sorted(dict(self.rulebook.live).items()):
            for index, block, _ in live.sources():
                info = host.kind("sources", block.kind)
                cls = getattr(info, "cls", None)
                if cls is None or cls.match_option is not None or getattr(cls.Options, "runs_command", False):
                    continue  # commands are never handed out; process watches need the daemon's view
                options = block.options()
                raw = options.get("path")
                if not isinstance(raw, str):
                    continue
                path = path_in_home(raw, home)
                if path is None:
                    continue
                out.append({"rule": rid, "index": index, "kind": block.kind, "options": {**options, "path": path}})
        return out

    def open(self, args: dict[str, Any], peer: tuple[int, int]) -> tuple[dict[str, Any], HelperSession | None]:
        uid = peer[1]
        home, why = home_of(uid)
        if home is None:
            return {"ok": False, "error": f"no session helper for this account: {why}", "code": "REFUSED"}, None
        with self._lock:
            if sum(1 for k in self.sessions if k[0] == uid) >= MAX_SESSIONS_PER_UID:
                return {
                    "ok": False,
                    "error": f"uid {uid} already has {MAX_SESSIONS_PER_UID} helpers",
                    "code": "REFUSED",
                }, None
            session = HelperSession(self, uid, home, next(self._numbers))
            self.sessions[session.key] = session
        try:
            return session.sources(), session
        except Exception:
            self.gone(session)
            raise

    def report(self, helper: tuple[int, int], key: SlotKey, state: SourceState) -> None:
        self.intake.on_helper(helper, key, state)

    def gone(self, session: HelperSession) -> None:
        with self._lock:
            self.sessions.pop(session.key, None)
        self.intake.helper_gone(session.key)

    def view(self) -> list[dict[str, Any]]:
        return [
            {"uid": s.uid, "session": s.key[1], "home": s.home, "sources": len(s.allowed)}
            for s in list(self.sessions.values())
        ]
