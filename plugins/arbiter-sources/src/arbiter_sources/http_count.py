"""``http_count``: a busy probe that GETs a URL and counts the work its answer lists.

The tenant is busy while the lists under ``count_keys`` (dotted paths into the JSON answer)
hold anything.  A queue can claim work that is not running (a stuck entry, a crashed worker),
so with ``vram_floor_gb`` a claim made while the tenant holds less VRAM than the floor is
*suspect*, and once it has not changed for ``stale_after_s`` it is *stale* and read as idle.
A probe that fails leaves the state unknown (``busy=None``), which the daemon counts as busy.

``models_key`` names a list of loaded models in the same answer; their names go into the
state's ``models`` so a release can be sent per model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from arbiter.plugin import (
    AnswerRefused,
    KindOptions,
    PluginContext,
    SecretRef,
    Source,
    SourceState,
    http_read,
    quote,
    secret_values,
    send_refused,
)

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

GIB = 1 << 30  # "GB" in rule files means GiB, as GPU tools show VRAM
#: an answer larger than this is not a status document
MAX_ANSWER_BYTES = 8 << 20


def _dotted(value: str) -> str:
    if not value or any(not part for part in value.split(".")):
        raise ValueError(f"{value!r} is not a dotted field path (like queue_running or data.models)")
    return value


class HttpProbeOptions(KindOptions):
    """What every busy probe over HTTP has: where, how often, and how a claim is corroborated."""

    def gives_phase(self) -> bool:
        return False

    url: str = Field(description="the http(s) URL to GET, e.g. http://127.0.0.1:8188/queue")
    every_s: float = Field(2.0, gt=0, le=3600, description="how often it is read (a wake-up reads it at once)")
    timeout_s: float = Field(2.0, gt=0, le=60, description="a read that takes longer fails (state unknown)")
    vram_floor_gb: float | None = Field(
        None, ge=0, description="a claim while the tenant holds less VRAM than this is suspect (GB = GiB)"
    )
    stale_after_s: float = Field(90.0, gt=0, description="a suspect claim unchanged this long is stale: idle")
    headers: dict[str, str | SecretRef] = Field(
        default_factory=dict,
        description="extra request headers; a secret as {from_file: PATH} or {from_env: NAME}, never inline",
    )

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https:// (got {value!r})")
        return value


class HttpCountOptions(HttpProbeOptions):
    """``{kind: http_count, url, count_keys, ...}``: busy while the lists hold anything."""

    kind: Literal["http_count"] = "http_count"
    count_keys: list[str] = Field(min_length=1, description="dotted paths of the lists whose lengths are summed")
    models_key: str | None = Field(None, description="dotted path of the list of loaded models, for per-model release")
    model_field: str = Field("name", description="the field of each entry of that list that names the model")

    @field_validator("count_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        return [_dotted(v) for v in value]

    @field_validator("models_key", "model_field")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return None if value is None else _dotted(value)

    def needs_trusted_file(self) -> str | None:
        # a header may carry a credential: only a trusted rule file has the daemon send one
        return "sends request headers" if self.headers else None


def lookup(doc: Any, dotted: str) -> Any:
    """``doc["a"]["b"]`` for ``"a.b"``; a key that itself contains the dots wins.  KeyError
    names what is missing."""
    if isinstance(doc, dict) and dotted in doc:
        return doc[dotted]
    value = doc
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


@dataclass(frozen=True)
class Answer:
    """What one answer claims: how much work, a fingerprint of it, and the loaded models."""

    count: int
    fingerprint: str
    models: tuple[str, ...]
    detail: str  # e.g. "queue_running 1 + queue_pending 2"


def _list_at(doc: Any, key: str, which: str) -> list[Any]:
    """The list under a dotted ``key``; ValueError says how the answer differs."""
    try:
        value = lookup(doc, key)
    except KeyError:
        raise ValueError(f"the answer has no {key!r}{which}") from None
    if not isinstance(value, list):
        raise ValueError(f"{key!r} in the answer is {type(value).__name__}, not a list")
    return value


def read_answer(
    doc: Any, count_keys: Sequence[str], models_key: str | None = None, model_field: str = "name"
) -> Answer:
    """Parse one answer; ValueError says what in it does not have the expected shape."""
    lists: list[Any] = []
    parts: list[str] = []
    for key in count_keys:
        value = _list_at(doc, key, "")
        lists.append(value)
        parts.append(f"{key} {len(value)}")
    models: list[str] = []
    if models_key is not None:
        for entry in _list_at(doc, models_key, " (models_key)"):
            name = entry if isinstance(entry, str) else None
            if isinstance(entry, dict):
                try:
                    name = lookup(entry, model_field)
                except KeyError:
                    name = None
            if not isinstance(name, str) or not name:
                raise ValueError(f"an entry of {models_key!r} has no {model_field!r} naming its model")
            models.append(name)
    # What the lists hold, not only how many: a queue moving on is a changed claim.
    digest = hashlib.sha256(json.dumps(lists, sort_keys=True, default=str).encode()).hexdigest()
    return Answer(sum(len(v) for v in lists), digest, tuple(models), " + ".join(parts))


class Corroborator:
    """Judges a claim of work against the VRAM the tenant holds (the clock is passed in).

    A claim (count > 0) is believed while the tenant holds at least the floor, while there is
    no floor, or while its VRAM cannot be read (never guess idle).  Below the floor it is
    suspect, and once it has not changed for ``stale_after_s`` it is stale: idle.
    """

    def __init__(self, floor_bytes: int | None, stale_after_s: float) -> None:
        self.floor_bytes = floor_bytes
        self.stale_after_s = stale_after_s
        self._fingerprint: str | None = None
        self._since = 0.0

    def judge(self, answer: Answer, held_bytes: int | None, now: float) -> tuple[bool, str]:
        """(busy, why) for this answer at ``now``."""
        if answer.fingerprint != self._fingerprint:
            self._fingerprint = answer.fingerprint
            self._since = now
        if answer.count == 0:
            return False, f"no work listed ({answer.detail})"
        claim = f"{answer.count} listed ({answer.detail})"
        if self.floor_bytes is None:
            return True, claim
        if held_bytes is None:
            return True, f"{claim}; its VRAM cannot be read to corroborate it, so it counts as busy"
        if held_bytes >= self.floor_bytes:
            return True, claim
        unchanged = now - self._since
        held = f"{held_bytes / GIB:.2f} GB, below the floor of {self.floor_bytes / GIB:g} GB"
        if unchanged >= self.stale_after_s:
            return False, f"stale: {claim} unchanged for {unchanged:.0f}s while it holds {held}; read as idle"
        return True, (
            f"suspect: {claim} while it holds {held}; stale if unchanged for {self.stale_after_s - unchanged:.0f}s more"
        )


class HttpProbe(Source):
    """Reads the URL every ``every_s`` (and at once on ``refresh()``) on its own thread while
    its program runs (not at all while the tick says it does not); a subclass says what an
    answer claims (:meth:`parse`)."""

    Options: ClassVar[type[HttpProbeOptions]] = HttpProbeOptions
    uses_vram = True
    accept = "application/json"

    def __init__(
        self, options: HttpProbeOptions, context: PluginContext, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(options, context)
        self.options: HttpProbeOptions = options
        self._clock = clock
        floor = None if options.vram_floor_gb is None else round(options.vram_floor_gb * GIB)
        self._judge = Corroborator(floor, options.stale_after_s)
        self._lock = threading.Lock()  # the tick (tenant_vram) and the probe thread both judge
        self._held: int | None = None
        self._answer: Answer | None = None
        self._answer_at = 0.0  # when the read that gave it began
        self._models: tuple[str, ...] = ()
        self._state = SourceState(readable=False, why=f"{options.url} not read yet")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_change: Callable[[SourceState], None] | None = None
        self._running = True  # whether its program runs: until the tick says otherwise, probe
        self.probes = 0  # answers and failures so far (tests and the bench wait on it)

    def start(self, on_change: Callable[[SourceState], None]) -> None:
        self._on_change = on_change
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name=f"arbiter-{type(self).__name__}:{self.options.url}", daemon=True
            )
            self._thread.start()

    def state(self) -> SourceState:
        return self._state

    def refresh(self) -> None:
        self._wake.set()

    def tenant_running(self, running: bool) -> None:
        with self._lock:
            if running == self._running:
                return
            self._running = running
            if not running:
                # what it last read was the program's that ended: unknown (busy) until read again
                self._answer = None
                self._set(
                    SourceState(
                        readable=False,
                        busy=None,
                        models=self._models,
                        why=f"{self.options.url} is not read while its program does not run",
                        changed_at=self._clock(),
                        read_at=self._clock(),
                    )
                )
        self._wake.set()  # a program that runs again is read at once; one that stopped, no more

    def tenant_vram(self, held_bytes: int | None) -> None:
        with self._lock:
            self._held = held_bytes
            if self._answer is not None:
                self._set(self._judged(self._answer))  # fed by the tick, which reads state() next

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.options.timeout_s + 2)

    # --- the probe thread ---------------------------------------------------------------

    def _loop(self) -> None:
        import httpx  # here: a process that never probes over HTTP does not carry it (it is large)

        try:
            headers = {"Accept": self.accept, **secret_values(self.options.headers)}
        except ValueError as exc:  # unknown: counted as busy, and said
            self._set(
                SourceState(
                    readable=False,
                    busy=None,
                    why=f"{self.options.url}: {exc}",
                    changed_at=self._clock(),
                    read_at=self._clock(),
                )
            )
            return
        # trust_env off: a tenant on this host is never reached through a proxy from the environment
        with httpx.Client(timeout=self.options.timeout_s, headers=headers, trust_env=False) as client:
            while not self._stop.is_set():
                running = self._running
                if running:
                    self.probe_once(client)
                # while its program does not run it sleeps until told it does (or to stop)
                self._wake.wait(self.options.every_s if running else None)
                self._wake.clear()  # a wake-up during the probe above is kept for the next wait

    def probe_once(self, client: httpx.Client) -> SourceState:
        """One read of the URL, judged and handed over; returns the new state."""
        began = self._clock()
        answer, why = self._fetch(client)
        with self._lock:
            self.probes += 1
            if not self._running:
                return self._state  # its program stopped while this read was under way
            if answer is None:
                self._answer = None
                state = SourceState(
                    readable=False, busy=None, models=self._models, why=why, changed_at=self._clock(), read_at=began
                )
            else:
                self._answer, self._answer_at = answer, began
                self._models = answer.models
                state = self._judged(answer)
            changed = self._set(state)
            state = self._state
        if changed and self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:
                log.exception("busy probe %s: on_change failed", self.options.url)
        return state

    def _fetch(self, client: httpx.Client) -> tuple[Answer | None, str]:
        import httpx

        url = self.options.url
        if self.options.headers:  # a credential goes only to the rule's own program
            refused = send_refused(self.context, url, self.options.headers)
            if refused is not None:
                return None, f"{url}: {refused}"
        try:
            response = http_read(client, "GET", url, total_s=self.options.timeout_s, max_bytes=MAX_ANSWER_BYTES)
        except httpx.TimeoutException:
            return None, f"{url} did not answer within {self.options.timeout_s:g}s"
        except httpx.HTTPError as exc:
            return None, f"cannot read {url}: {exc}; is the program running and listening there?"
        except AnswerRefused as exc:
            return None, f"{exc}: not a status document"
        if response.status_code != 200:
            return None, f"{url} answered HTTP {response.status_code}: {quote(response.text)}"
        try:
            return self.parse(response.text), ""
        except ValueError as exc:
            return None, f"{url}: {exc}"

    def parse(self, text: str) -> Answer:
        """What one answer (a 200's body) claims; ValueError says how it has the wrong shape."""
        raise NotImplementedError

    def _judged(self, answer: Answer) -> SourceState:
        busy, why = self._judge.judge(answer, self._held, self._clock())
        return SourceState(
            readable=True, busy=busy, models=answer.models, why=why, changed_at=self._clock(), read_at=self._answer_at
        )

    def _set(self, state: SourceState) -> bool:
        """Keep ``state``; True when what the daemon decides on changed (readable, busy, models)."""
        prev = self._state
        changed = (state.readable, state.busy, state.models) != (prev.readable, prev.busy, prev.models)
        if not changed:
            # only the note changed: keep when the decisive change was seen
            state = SourceState(
                readable=state.readable,
                busy=state.busy,
                models=state.models,
                why=state.why,
                changed_at=prev.changed_at,
                read_at=state.read_at,
            )
        self._state = state
        return changed


def json_answer(text: str) -> Any:
    """The JSON document of an answer; ValueError quotes what it was instead."""
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"did not answer JSON: {quote(text)!r}") from None


class HttpCountSource(HttpProbe):
    """Busy while the lists under ``count_keys`` hold anything."""

    Options = HttpCountOptions

    def __init__(
        self, options: HttpCountOptions, context: PluginContext, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(options, context, clock)
        self.options: HttpCountOptions = options

    def parse(self, text: str) -> Answer:
        o = self.options
        try:
            return read_answer(json_answer(text), o.count_keys, o.models_key, o.model_field)
        except ValueError as exc:
            raise ValueError(f"{exc}; check count_keys/models_key against what it answers") from None
