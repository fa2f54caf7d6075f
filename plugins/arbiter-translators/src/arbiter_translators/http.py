"""``http_post``: ask a daemon over HTTP to release its VRAM, or to take it back.

It returns what it sent and every error in an :class:`arbiter.plugin.ActionResult`: a
tenant that does not answer must never break the daemon's loop.  It never reaches its tenant
through a proxy from the environment (tenants run on this host).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from arbiter.plugin import (
    ActionResult,
    HttpAnswer,
    KindOptions,
    PluginContext,
    PluginError,
    SecretRef,
    Translator,
    http_read,
    quote,
    secret_values,
    send_refused,
)

if TYPE_CHECKING:
    import httpx

#: at most this much of an error answer is quoted back (printable characters only): what a
#: program answers is its own, and status is readable by every account
QUOTE_CHARS = 80
#: an undo step is sent even when the action used its timeout_s up: it has this long of its own
UNDO_S = 5.0


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https:// (got {value!r})")
    return value


def _answer_text(response: HttpAnswer) -> str:
    return quote(response.text, QUOTE_CHARS)


def _client(headers: dict[str, str | SecretRef]) -> httpx.Client:
    """A client kept open between requests: the next one starts without a new connection.
    httpx is imported here: a process that never makes one (the reflex process, a daemon
    with no such rule) does not carry it, and it is large."""
    import httpx

    try:
        values = secret_values(headers)
    except ValueError as exc:
        raise PluginError(f"a request header: {exc}") from None
    return httpx.Client(trust_env=False, headers=values)


def _failure(what: str, url: str, exc: Exception, timeout_s: float) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"{what}: {url} did not answer within {timeout_s:.3g}s"
    if isinstance(exc, httpx.HTTPError):
        return f"{what}: cannot reach {url}: {exc}; is the program running and listening there?"
    return f"{what}: {type(exc).__name__}: {exc}"


# --- http_post ---------------------------------------------------------------------------------


class HttpStep(BaseModel):
    """``{url, body}``: one more request of a release or reacquire, sent before or after its own."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="the URL to POST to (a path is joined to the rule's base_url)")
    body: dict[str, Any] = Field(default_factory=dict, description="the JSON body sent")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)


class HttpPostOptions(KindOptions):
    """``{kind: http_post, url, body, per_model, timeout_s, confirm, before, after, if_failed}``:
    POST a JSON body to release VRAM (or take it back), with the steps a server needs around it."""

    kind: Literal["http_post"] = "http_post"
    url: str = Field(description="the URL to POST to, e.g. http://127.0.0.1:8188/free")
    body: dict[str, Any] = Field(default_factory=dict, description="the JSON body sent")
    per_model: bool = Field(False, description="one request per loaded model, its name added to the body")
    model_field: str = Field("model", min_length=1, description="the body field the model's name goes into")
    timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description=(
            "the whole release must be answered within this, and the daemon waits this long for the "
            "tenant's VRAM to fall"
        ),
    )
    confirm: bool = Field(True, description="the release counts only once the tenant's VRAM is seen to fall")
    headers: dict[str, str | SecretRef] = Field(
        default_factory=dict,
        description="extra request headers; a secret as {from_file: PATH} or {from_env: NAME}, never inline",
    )
    before: list[HttpStep] = Field(
        default_factory=list,
        description=(
            "requests sent first, in order (a drain step: stop new work); one that fails stops the action "
            "before its own request is sent"
        ),
    )
    after: list[HttpStep] = Field(
        default_factory=list,
        description="requests sent, in order, once its own request succeeded (e.g. let work go on again)",
    )
    if_failed: list[HttpStep] = Field(
        default_factory=list,
        description="requests sent when a request fails after a before step was sent (undo it: let work go on)",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)

    @model_validator(mode="after")
    def _model_field_free(self) -> HttpPostOptions:
        if self.per_model and self.model_field in self.body:
            raise ValueError(
                f"with per_model the body must not set {self.model_field!r}: each request sets it "
                "to a loaded model's name"
            )
        return self

    def needs_trusted_file(self) -> str | None:
        return "sends requests that change what a program does"


class HttpPostTranslator(Translator):
    """Sends the release; with ``per_model``, one request per model the busy probe read loaded,
    and none when none is.  Requests go one after another within ``timeout_s`` in all."""

    Options = HttpPostOptions
    actions = frozenset({"release", "reacquire"})

    def __init__(self, options: HttpPostOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: HttpPostOptions = options
        self._lock = threading.Lock()  # one release of this tenant at a time, on one client
        self._client = _client(options.headers)

    def close(self) -> None:
        self._client.close()

    def bodies(self, models: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """(what, body) for each request a release sends."""
        if not self.options.per_model:
            return [("release", dict(self.options.body))]
        seen: list[str] = []
        for name in models:
            if name not in seen:  # a name listed twice is unloaded once
                seen.append(name)
        return [(f"model {name}", {**self.options.body, self.options.model_field: name}) for name in seen]

    def release(self, tenant: str, models: Sequence[str] = ()) -> ActionResult:
        return self._send(tenant, models, "release")

    def reacquire(self, tenant: str, models: Sequence[str] = ()) -> ActionResult:
        """The same request, sent to bring the tenant back (``url`` is its wake-up URL)."""
        return self._send(tenant, models, "reacquire")

    def _send(self, tenant: str, models: Sequence[str], action: str) -> ActionResult:
        requests = [(action if what == "release" else what, body) for what, body in self.bodies(models)]
        if not requests:
            return ActionResult(note=f"{tenant!r} has no model loaded: nothing to {action}, no request sent")
        o = self.options
        for url in dict.fromkeys([o.url, *(step.url for step in (*o.before, *o.after, *o.if_failed))]):
            refused = send_refused(self.context, url, o.headers)  # only to the rule's own program
            if refused is not None:
                return ActionResult(errors=(f"{action}: not sent to {url}: {refused}",))
        sent: list[str] = []
        errors: list[str] = []
        with self._lock:
            deadline = time.monotonic() + o.timeout_s
            for step in o.before:  # a drain step: the action's own request only once it went through
                if not self._post(f"{action} step {step.url}", step.url, step.body, deadline, action, sent, errors):
                    break
            if not errors:
                for what, body in requests:
                    self._post(what, o.url, body, deadline, action, sent, errors)
            # a server left drained would hold its users' requests for ever: its steps are undone
            steps = o.if_failed if errors and o.before and sent else () if errors else o.after
            for step in steps:
                self._post(
                    f"{action} step {step.url}",
                    step.url,
                    step.body,
                    max(deadline, time.monotonic() + UNDO_S),
                    action,
                    sent,
                    errors,
                )
        return ActionResult(requested=tuple(sent), errors=tuple(errors))

    def _post(
        self,
        what: str,
        url: str,
        body: dict[str, Any],
        deadline: float,
        action: str,
        sent: list[str],
        errors: list[str],
    ) -> bool:
        """POST ``body`` to ``url`` before ``deadline``; whether it was answered 2xx (what went
        wrong goes to ``errors``)."""
        left = deadline - time.monotonic()
        if left <= 0:
            errors.append(f"{what}: not sent, the {action}'s {self.options.timeout_s:g}s (timeout_s) were used up")
            return False
        sent.append(what)
        try:
            response = http_read(self._client, "POST", url, total_s=left, json=body)
        except Exception as exc:  # any failure is returned: never raised into the loop
            errors.append(_failure(what, url, exc, self.options.timeout_s))
            return False
        if not 200 <= response.status_code < 300:
            errors.append(f"{what}: POST {url} answered HTTP {response.status_code}: {_answer_text(response)}")
            return False
        return True
