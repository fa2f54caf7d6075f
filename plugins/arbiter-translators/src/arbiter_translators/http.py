"""``http_post``: ask a daemon over HTTP to release its VRAM; ``http_knob``: turn a duty into a
daemon's own setting (a batch size, a rate limit) through a templated request.

Both return what they sent and every error in an :class:`arbiter.plugin.ActionResult`: a
tenant that does not answer must never break the daemon's loop.  Neither reaches its tenant
through a proxy from the environment (tenants run on this host).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from arbiter.plugin import ActionResult, KindOptions, PluginContext, Translator

if TYPE_CHECKING:
    import httpx

#: at most this much of an error answer is quoted back
QUOTE_CHARS = 200


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https:// (got {value!r})")
    return value


def _answer_text(response: httpx.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 3] + "..."


def _client(headers: dict[str, str]) -> httpx.Client:
    """A client kept open between requests: the next one starts without a new connection.
    httpx is imported here: a process that never makes one (the reflex process, a daemon
    with no such rule) does not carry it, and it is large."""
    import httpx

    return httpx.Client(trust_env=False, headers=headers)


def _failure(what: str, url: str, exc: Exception, timeout_s: float) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"{what}: {url} did not answer within {timeout_s:.3g}s"
    if isinstance(exc, httpx.HTTPError):
        return f"{what}: cannot reach {url}: {exc}; is the program running and listening there?"
    return f"{what}: {type(exc).__name__}: {exc}"


# --- http_post ---------------------------------------------------------------------------------


class HttpPostOptions(KindOptions):
    """``{kind: http_post, url, body, per_model, timeout_s, confirm}``: POST a JSON body to release VRAM."""

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
    headers: dict[str, str] = Field(default_factory=dict, description="extra request headers")

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
        url, timeout = self.options.url, self.options.timeout_s
        sent: list[str] = []
        errors: list[str] = []
        with self._lock:
            deadline = time.monotonic() + timeout
            for what, body in requests:
                left = deadline - time.monotonic()
                if left <= 0:
                    errors.append(f"{what}: not sent, the {action}'s {timeout:g}s (timeout_s) were used up")
                    continue
                sent.append(what)
                try:
                    response = self._client.post(url, json=body, timeout=left)
                except Exception as exc:  # any failure is returned: never raised into the loop
                    errors.append(_failure(what, url, exc, timeout))
                    continue
                if not 200 <= response.status_code < 300:
                    errors.append(f"{what}: POST {url} answered HTTP {response.status_code}: {_answer_text(response)}")
        return ActionResult(requested=tuple(sent), errors=tuple(errors))


# --- http_knob ---------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{(duty|value)\}")


def _render(template: Any, values: dict[str, Any], quote: bool = False) -> Any:
    """``template`` with ``{duty}`` and ``{value}`` filled in.  A string that is only a
    placeholder becomes the value itself (a number stays a number); inside a longer string it
    is written as text.  Other braces are left as they are."""
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole and not quote:
            return values[whole.group(1)]

        def text(m: re.Match[str]) -> str:
            value = values[m.group(1)]
            shown = json.dumps(value) if not isinstance(value, str) else value
            return urllib.parse.quote(shown, safe="") if quote else shown

        return _PLACEHOLDER.sub(text, template)
    if isinstance(template, dict):
        return {k: _render(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_render(v, values) for v in template]
    return template


class HttpKnobOptions(KindOptions):
    """``{kind: http_knob, url, method, body, levels}``: a duty as the program's own setting.

    ``levels`` maps a duty to a value: a duty gets the value of the highest level at or below
    it (``{0: 1, 0.5: 4, 1: 8}``: duty 0.7 → 4).  Without ``levels`` the value is the duty.
    ``{duty}`` and ``{value}`` in ``url`` and in ``body``'s strings are filled in.
    """

    kind: Literal["http_knob"] = "http_knob"
    url: str = Field(description="the URL; may contain {duty} and {value}")
    method: Literal["POST", "PUT", "PATCH", "GET"] = Field("POST", description="the HTTP method that sets the value")
    body: Any = Field(None, description="a JSON template; a string that is only {value} becomes the value itself")
    levels: dict[float, Any] | None = Field(None, description="duty → value, e.g. {0: 1, 0.5: 4, 1: 8}")
    timeout_s: float = Field(5.0, gt=0, le=60, description="a request not answered by then failed")
    headers: dict[str, str] = Field(default_factory=dict, description="extra request headers")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: dict[float, Any] | None) -> dict[float, Any] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("levels is empty: give at least {0: VALUE}")
        bad = [k for k in value if not 0.0 <= k <= 1.0]
        if bad:
            raise ValueError(f"levels are duties from 0 to 1; {', '.join(f'{k:g}' for k in bad)} is not")
        if 0.0 not in value:
            raise ValueError("levels must include 0, so that every duty has a value")
        return dict(sorted(value.items()))

    @model_validator(mode="after")
    def _get_has_no_body(self) -> HttpKnobOptions:
        if self.method == "GET" and self.body is not None:
            raise ValueError("a GET request sends no body: put {value} in the url, or use POST or PUT")
        return self

    def value_for(self, duty: float) -> Any:
        if self.levels is None:
            return round(duty, 4)
        chosen = self.levels[0.0]
        for level, value in self.levels.items():
            if level <= duty + 1e-9:  # a duty of 0.5 written as 0.49999… still reaches 0.5
                chosen = value
        return chosen


class HttpKnobTranslator(Translator):
    """Sends the rendered request when the value it would set differs from the last one it set
    (many duties map to one level; a failed request is sent again next time)."""

    Options = HttpKnobOptions
    actions = frozenset({"duty"})

    def __init__(self, options: HttpKnobOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: HttpKnobOptions = options
        self._lock = threading.Lock()
        self._client = _client(options.headers)
        self._applied: tuple[str, str, str] | None = None  # the last request that succeeded

    def close(self) -> None:
        self._client.close()

    def request_for(self, duty: float) -> tuple[str, str, Any]:
        """(method, url, body) for ``duty``."""
        value = self.options.value_for(duty)
        values = {"duty": round(duty, 4), "value": value}
        url = _render(self.options.url, values, quote=True)
        body = None if self.options.body is None else _render(self.options.body, values)
        return self.options.method, url, body

    def set_duty(self, tenant: str, duty: float) -> ActionResult:
        if not 0.0 <= duty <= 1.0:
            return ActionResult(errors=(f"duty {duty!r} for {tenant!r} is not between 0 and 1",))
        method, url, body = self.request_for(duty)
        value = self.options.value_for(duty)
        what = f"{method} {url} value {json.dumps(value)} (duty {duty:.2f})"
        key = (method, url, json.dumps(body, sort_keys=True))
        with self._lock:
            if key == self._applied:
                return ActionResult(note=f"{tenant!r} already has value {json.dumps(value)}: no request sent")
            try:
                response = self._client.request(method, url, json=body, timeout=self.options.timeout_s)
            except Exception as exc:  # returned, never raised into the loop
                self._applied = None
                return ActionResult(requested=(what,), errors=(_failure(what, url, exc, self.options.timeout_s),))
            if not 200 <= response.status_code < 300:
                self._applied = None
                return ActionResult(
                    requested=(what,),
                    errors=(f"{what}: answered HTTP {response.status_code}: {_answer_text(response)}",),
                )
            self._applied = key
        return ActionResult(requested=(what,))
