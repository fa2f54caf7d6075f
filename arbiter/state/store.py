"""Durable state in SQLite (WAL): timeline, paused set, job registry, last good rule files.

One connection shared by the daemon's threads behind a lock; the fast path never calls
here (it appends to :class:`arbiter.state.journal.PausedJournal` and hands the rest to the recorder thread).

It runs past 400 lines because each table's statements stay beside its schema, behind the
one connection and lock they share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from arbiter.state.certificates import Certificate
from arbiter.state.journal import PausedEntry

SCHEMA = """
CREATE TABLE IF NOT EXISTS timeline (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    t REAL NOT NULL, code TEXT NOT NULL, subject TEXT NOT NULL, message TEXT NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS timeline_t ON timeline(t);
-- the newest events of one code or one subject, without scanning the whole timeline
CREATE INDEX IF NOT EXISTS timeline_code ON timeline(code, id);
CREATE INDEX IF NOT EXISTS timeline_subject ON timeline(subject, id);
CREATE TABLE IF NOT EXISTS paused (
    job_id TEXT NOT NULL, how TEXT NOT NULL, pid INTEGER NOT NULL, start_time REAL NOT NULL,
    translator TEXT NOT NULL, control_path TEXT, t REAL NOT NULL,
    PRIMARY KEY (job_id, how, pid)
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner_uid INTEGER NOT NULL, name TEXT NOT NULL, manifest TEXT NOT NULL,
    cmd TEXT NOT NULL, launcher_pid INTEGER NOT NULL, launcher_start REAL NOT NULL,
    root_pid INTEGER, root_start REAL, state TEXT NOT NULL, control_path TEXT NOT NULL,
    events_path TEXT NOT NULL, submitted REAL NOT NULL, ended REAL, exit_code INTEGER,
    seq INTEGER NOT NULL DEFAULT 0, stop_requested REAL, user_hold INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rule_files (
    path TEXT PRIMARY KEY, content TEXT NOT NULL, sha256 TEXT NOT NULL, saved REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trust (
    name TEXT PRIMARY KEY, record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS governors (
    rule TEXT PRIMARY KEY, record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS held (
    job TEXT PRIMARY KEY, since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS protections (
    rule TEXT PRIMARY KEY, spans TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS certificates (
    id INTEGER PRIMARY KEY AUTOINCREMENT, rule TEXT NOT NULL, work TEXT NOT NULL, duty REAL NOT NULL,
    r REAL NOT NULL, r_low REAL NOT NULL, r_high REAL NOT NULL, margin REAL NOT NULL, run_id TEXT NOT NULL,
    issued_at REAL NOT NULL, node TEXT NOT NULL, fingerprint TEXT NOT NULL, exe_path TEXT NOT NULL,
    exe_sha256 TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cert_superseded (
    cert_id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, why TEXT NOT NULL, at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cert_origin (
    cert_id INTEGER PRIMARY KEY, node TEXT NOT NULL, confirm_run TEXT NOT NULL, blocks INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fleet_seen (
    signer TEXT NOT NULL, rule TEXT NOT NULL, work TEXT NOT NULL, issued_at REAL NOT NULL,
    PRIMARY KEY (signer, rule, work)
);
CREATE TABLE IF NOT EXISTS fleet_refused (
    digest TEXT PRIMARY KEY, name TEXT NOT NULL, code TEXT NOT NULL, why TEXT NOT NULL, at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS profiles (
    rule TEXT PRIMARY KEY, kind TEXT NOT NULL, options TEXT NOT NULL, saved TEXT NOT NULL, applied REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ab_runs (
    id TEXT PRIMARY KEY, rule TEXT NOT NULL, status TEXT NOT NULL, record TEXT NOT NULL,
    started REAL NOT NULL, updated REAL NOT NULL
);
"""


@dataclass
class JobRecord:
    id: str
    owner_uid: int
    name: str
    manifest: dict[str, Any]
    cmd: list[str]
    launcher_pid: int
    launcher_start: float
    control_path: str
    events_path: str
    submitted: float
    state: str = "pending"  # pending | running | ended
    root_pid: int | None = None
    root_start: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    seq: int = 0
    stop_requested: float | None = None
    user_hold: bool = False

    def rooted_at(self, pid: int, start_time: float) -> bool:
        """Whether its root is this process (a pid's start time tells a reused pid apart)."""
        return pid == self.root_pid and self.root_start is not None and abs(start_time - self.root_start) <= 0.01

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["manifest"] = json.dumps(self.manifest)
        row["cmd"] = json.dumps(self.cmd)
        row["user_hold"] = int(self.user_hold)
        return row

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        data = dict(row)
        data["manifest"] = json.loads(data["manifest"])
        data["cmd"] = json.loads(data["cmd"])
        data["user_hold"] = bool(data["user_hold"])
        return cls(**{f.name: data[f.name] for f in fields(cls)})


#: how long an ended job's row and folder are kept (for `arbiter status` and the timeline)
ENDED_JOBS_KEPT_S = 24 * 3600.0
#: how many ended jobs' rows and folders are kept at most, unless the node config says
#: (``quotas.ended_jobs_kept``): the newest
ENDED_JOBS_KEPT = 1000
#: a job's command line is stored cut to this many bytes (its words, UTF-8): status shows
#: what a job runs, and the database must not grow by what any account passes
STORED_CMD_BYTES = 4096


def stored_cmd(cmd: list[str], most: int = STORED_CMD_BYTES) -> list[str]:
    """``cmd`` as stored: its words while they fit in ``most`` bytes, the word that does not
    cut, and a last word saying how much was left out."""
    out: list[str] = []
    used = 0
    for i, word in enumerate(cmd):
        size = len(word.encode("utf-8", "surrogatepass"))
        if used + size <= most:
            out.append(word)
            used += size
            continue
        kept = word.encode("utf-8", "surrogatepass")[: max(0, most - used)].decode("utf-8", "ignore")
        left = (
            size
            - len(kept.encode("utf-8", "surrogatepass"))
            + sum(len(w.encode("utf-8", "surrogatepass")) for w in cmd[i + 1 :])
        )
        return [*out, kept, f"[{left} more bytes not stored]"] if kept else [*out, f"[{left} more bytes not stored]"]
    return out


#: the database and its side files: the database holds every rule file's text, whose
#: headers and tokens are no other account's to read
DB_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def private_files(db: Path) -> None:
    """The database (made here when missing) and each side file there, mode 0600 whatever the
    umask; SQLite gives the side files it makes later the database's mode.  A file that
    cannot be changed (a read-only file system) is left, and said: the daemon still runs."""
    for suffix in DB_SIDE_FILES:
        path = f"{db}{suffix}"
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            try:
                fd = os.open(path, flags)
            except FileNotFoundError:
                if suffix:
                    continue
                fd = os.open(path, flags | os.O_CREAT, 0o600)
            try:
                if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
                    os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
        except OSError as exc:
            logging.getLogger("arbiter.state.store").warning(
                "cannot make %s readable by the daemon's account alone: %s", path, exc.strerror or exc
            )


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        private_files(path)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=10)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # a COMMIT that failed (a full disk) may leave the transaction open: every
                # later BEGIN would fail too, even once there is room again
                if self._db.in_transaction:
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # the error being raised says more than this one
                raise

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # --- timeline ---------------------------------------------------------------------------

    @staticmethod
    def add_event(db: sqlite3.Connection, event: Mapping[str, Any]) -> None:
        db.execute(
            "INSERT INTO timeline (t, code, subject, message, data) VALUES (?, ?, ?, ?, ?)",
            (
                event["t"],
                event["code"],
                event["subject"],
                event["message"],
                json.dumps(event.get("data", {}), default=str),
            ),
        )

    def timeline(self, limit: int = 50, subject: str | None = None, code: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM timeline"
        where, args = [], []
        if subject:
            where.append("subject = ?")
            args.append(subject)
        if code:
            where.append("code = ?")
            args.append(code)
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._query(sql + " ORDER BY id DESC LIMIT ?", (*args, limit))
        return [{**dict(r), "data": json.loads(r["data"])} for r in reversed(rows)]

    # --- paused set -------------------------------------------------------------------------

    @staticmethod
    def put_paused(db: sqlite3.Connection, entry: PausedEntry) -> None:
        db.execute(
            "INSERT OR REPLACE INTO paused VALUES (?, ?, ?, ?, ?, ?, ?)",
            (entry.job_id, entry.how, entry.pid, entry.start_time, entry.translator, entry.control_path, time.time()),
        )

    @staticmethod
    def drop_paused(db: sqlite3.Connection, key: tuple[str, str, int]) -> None:
        db.execute("DELETE FROM paused WHERE job_id = ? AND how = ? AND pid = ?", key)

    def paused(self) -> list[PausedEntry]:
        rows = self._query("SELECT job_id, how, pid, start_time, translator, control_path FROM paused")
        return [PausedEntry(**dict(r)) for r in rows]

    def clear_paused(self) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM paused")

    # --- jobs -------------------------------------------------------------------------------

    @staticmethod
    def put_job(db: sqlite3.Connection, job: JobRecord, ended_kept: int = ENDED_JOBS_KEPT) -> None:
        """Write ``job``; a job newly registered also takes away the rows of jobs that ended
        more than :data:`ENDED_JOBS_KEPT_S` ago, and of all but the newest ``ended_kept``
        ended jobs (any account may register jobs, each a row)."""
        row = job.to_row()
        cols = ", ".join(row)
        db.execute(f"INSERT OR REPLACE INTO jobs ({cols}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
        if job.state == "pending" or job.root_pid == job.launcher_pid:  # registered, or handed over
            db.execute("DELETE FROM jobs WHERE state = 'ended' AND ended < ?", (time.time() - ENDED_JOBS_KEPT_S,))
            db.execute(
                "DELETE FROM jobs WHERE state = 'ended' AND id NOT IN "
                "(SELECT id FROM jobs WHERE state = 'ended' ORDER BY ended DESC LIMIT ?)",
                (ended_kept,),
            )

    def jobs(self, include_ended: bool = False) -> list[JobRecord]:
        sql = "SELECT * FROM jobs" + ("" if include_ended else " WHERE state != 'ended'") + " ORDER BY submitted"
        return [JobRecord.from_row(r) for r in self._query(sql)]

    # --- rule files -------------------------------------------------------------------------

    def save_rule_file(self, path: str, content: str) -> None:
        digest = hashlib.sha256(content.encode()).hexdigest()
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO rule_files VALUES (?, ?, ?, ?)", (path, content, digest, time.time()))

    def last_good_rule_files(self) -> dict[str, str]:
        return {r["path"]: r["content"] for r in self._query("SELECT path, content FROM rule_files")}

    # --- job names' compliance records (strikes and distrust, wall-clock times) -------------

    @staticmethod
    def put_trust(db: sqlite3.Connection, records: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace every name's record with ``records``."""
        db.execute("DELETE FROM trust")
        db.executemany("INSERT INTO trust VALUES (?, ?)", [(n, json.dumps(r)) for n, r in records.items()])

    def trust(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: json.loads(r["record"]) for r in self._query("SELECT name, record FROM trust")}

    # --- governors (per rule, wall-clock times) ----------------------------------------------

    @staticmethod
    def put_governors(db: sqlite3.Connection, records: Mapping[str, Mapping[str, Any]]) -> None:
        db.execute("DELETE FROM governors")
        db.executemany("INSERT INTO governors VALUES (?, ?)", [(r, json.dumps(v)) for r, v in records.items()])

    def governors(self) -> dict[str, dict[str, Any]]:
        return {r["rule"]: json.loads(r["record"]) for r in self._query("SELECT rule, record FROM governors")}

    # --- jobs protection pauses: since when (wall-clock), for eviction ------------------------

    @staticmethod
    def put_held(db: sqlite3.Connection, since: Mapping[str, float]) -> None:
        db.execute("DELETE FROM held")
        db.executemany("INSERT INTO held VALUES (?, ?)", list(since.items()))

    def held(self) -> dict[str, float]:
        return {r["job"]: float(r["since"]) for r in self._query("SELECT job, since FROM held")}

    # --- how long each rule's latest protections held fleet work (evict_after_s: auto) --------

    @staticmethod
    def put_protections(db: sqlite3.Connection, spans: Mapping[str, Sequence[float]]) -> None:
        db.execute("DELETE FROM protections")
        db.executemany(
            "INSERT INTO protections VALUES (?, ?)", [(r, json.dumps(list(s))) for r, s in spans.items() if s]
        )

    def protections(self, kept: int) -> dict[str, tuple[float, ...]]:
        """Each rule's latest ``kept`` spans, oldest first; a row that is not a rule's list of
        numbers is left out, and so is a span that is not a finite duration."""
        out = {}
        for r in self._query("SELECT rule, spans FROM protections"):
            try:
                spans = json.loads(r["spans"])
                if not isinstance(r["rule"], str) or not isinstance(spans, list):
                    raise TypeError("not a rule's list of spans")
                durations = [float(x) for x in spans if isinstance(x, int | float) and 0 <= x < math.inf]
                out[r["rule"]] = tuple(durations[-kept:])
            except (ValueError, TypeError):
                logging.getLogger("arbiter.state.store").warning(
                    "state: the protections of rule %r are not readable; they start again", r["rule"]
                )
        return out

    # --- certificates -----------------------------------------------------------------------

    def add_certificate(self, cert: Certificate) -> int:
        with self.transaction() as db:
            return self.insert_certificate(db, cert)

    @staticmethod
    def supersede(db: sqlite3.Connection, rule: str, work: str, duty: float, run_id: str, why: str) -> int:
        """A run that showed a slowdown at ``duty`` retires the rule's certificates for the same
        work at that duty or above: the highest level that passes is the certified one."""
        cur = db.execute(
            "INSERT OR IGNORE INTO cert_superseded SELECT id, ?, ?, ? FROM certificates"
            " WHERE rule = ? AND work = ? AND duty >= ?",
            (run_id, why, time.time(), rule, work, duty),
        )
        return cur.rowcount

    def certificates(self) -> list[Certificate]:
        rows = self._query(
            "SELECT c.*, s.why AS superseded, o.node AS origin, o.blocks AS confirm_blocks FROM certificates c"
            " LEFT JOIN cert_superseded s ON s.cert_id = c.id LEFT JOIN cert_origin o ON o.cert_id = c.id"
            " ORDER BY c.issued_at"
        )
        return [
            Certificate(
                rule=r["rule"],
                work=r["work"],
                duty=r["duty"],
                r=r["r"],
                r_low=r["r_low"],
                r_high=r["r_high"],
                margin=r["margin"],
                run_id=r["run_id"],
                issued_at=r["issued_at"],
                node=r["node"],
                fingerprint=json.loads(r["fingerprint"]),
                exe_path=r["exe_path"],
                exe_sha256=r["exe_sha256"],
                id=r["id"],
                superseded=r["superseded"] or "",
                origin=r["origin"] or "",
                confirm_blocks=r["confirm_blocks"] or 0,
            )
            for r in rows
        ]

    # --- GPU profiles applied (what to restore, also after a crash) ----------------------------

    def put_profile(self, rule: str, kind: str, options: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
        with self.transaction() as db:  # committed before the profile is applied
            db.execute(
                "INSERT OR REPLACE INTO profiles VALUES (?, ?, ?, ?, ?)",
                (rule, kind, json.dumps(dict(options)), json.dumps(dict(saved)), time.time()),
            )

    def drop_profile(self, rule: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM profiles WHERE rule = ?", (rule,))

    def profiles(self) -> dict[str, dict[str, Any]]:
        rows = self._query("SELECT rule, kind, options, saved FROM profiles")
        return {
            r["rule"]: {"kind": r["kind"], "options": json.loads(r["options"]), "saved": json.loads(r["saved"])}
            for r in rows
        }

    # --- paired ON/OFF runs (their blocks and verdicts; see arbiter.engine.abrun) -------------

    @staticmethod
    def put_run(db: sqlite3.Connection, record: Mapping[str, Any]) -> None:
        spec = record["spec"]
        db.execute(
            "INSERT OR REPLACE INTO ab_runs VALUES (?, ?, ?, ?, ?, ?)",
            (
                spec["run_id"],
                spec["rule_id"],
                record["status"],
                json.dumps(record),
                record["started_wall"],
                time.time(),
            ),
        )

    def runs(self, limit: int = 100) -> list[dict[str, Any]]:
        rows = self._query("SELECT record FROM ab_runs ORDER BY started DESC, id DESC LIMIT ?", (limit,))
        return [json.loads(r["record"]) for r in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT record FROM ab_runs WHERE id = ?", (run_id,))
        return json.loads(rows[0]["record"]) if rows else None

    def running_run(self) -> dict[str, Any] | None:
        rows = self._query("SELECT record FROM ab_runs WHERE status = 'running' ORDER BY started DESC LIMIT 1")
        return json.loads(rows[0]["record"]) if rows else None

    @staticmethod
    def insert_certificate(db: sqlite3.Connection, cert: Certificate) -> int:
        cur = db.execute(
            "INSERT INTO certificates (rule, work, duty, r, r_low, r_high, margin, run_id, issued_at, node,"
            " fingerprint, exe_path, exe_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                cert.rule,
                cert.work,
                cert.duty,
                cert.r,
                cert.r_low,
                cert.r_high,
                cert.margin,
                cert.run_id,
                cert.issued_at,
                cert.node,
                json.dumps(dict(cert.fingerprint)),
                cert.exe_path,
                cert.exe_sha256,
            ),
        )
        cert_id = int(cur.lastrowid or 0)
        if cert.origin:
            db.execute(
                "INSERT INTO cert_origin VALUES (?, ?, ?, ?)", (cert_id, cert.origin, cert.run_id, cert.confirm_blocks)
            )
        return cert_id

    # --- certificates published by twins (see arbiter.daemon.fleetcerts) ----------------------

    @staticmethod
    def saw_published(db: sqlite3.Connection, signer: str, rule: str, work: str, issued_at: float) -> None:
        """The newest certificate read from ``signer`` for the rule and work: an older copy is a replay."""
        db.execute(
            "INSERT INTO fleet_seen VALUES (?, ?, ?, ?) ON CONFLICT (signer, rule, work)"
            " DO UPDATE SET issued_at = max(issued_at, excluded.issued_at)",
            (signer, rule, work, issued_at),
        )

    def published_seen(self) -> dict[tuple[str, str, str], float]:
        rows = self._query("SELECT signer, rule, work, issued_at FROM fleet_seen")
        return {(r["signer"], r["rule"], r["work"]): float(r["issued_at"]) for r in rows}

    @staticmethod
    def refuse_published(db: sqlite3.Connection, digest: str, name: str, code: str, why: str) -> None:
        db.execute(
            "INSERT OR REPLACE INTO fleet_refused VALUES (?, ?, ?, ?, ?)", (digest, name, code, why, time.time())
        )

    def published_refused(self) -> dict[str, tuple[str, str]]:
        """Published certificates a confirmation refused, by the digest of their signed payload: (code, why)."""
        rows = self._query("SELECT digest, code, why FROM fleet_refused")
        return {r["digest"]: (r["code"], r["why"]) for r in rows}
