"""Every HTTP request a plugin makes, read with a byte cap and a total deadline.

A program the daemon talks to is not trusted: an answer of hundreds of megabytes, or one
that trickles a byte at a time inside each read timeout, must cost the daemon neither its
memory nor its time.  So an answer is streamed: a declared length over the cap is refused
before anything is read, the body stops at the cap, and the whole exchange ends at a
deadline however the bytes arrive.  What is quoted of an answer in a status line is short
and printable only (:func:`quote`).

httpx is imported by the caller, which passes its client: a process that never makes a
request does not carry it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

#: an answer larger than this is not a status or control answer
DEFAULT_MAX_BYTES = 1 << 20
#: characters of an answer quoted in a status line, at most
QUOTE_CHARS = 80


class AnswerRefused(Exception):
    """The answer was too large, or did not end by the deadline."""


@dataclass(frozen=True)
class HttpAnswer:
    """What came back: the status and the body, whole (never more than the cap)."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def http_read(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    total_s: float,
    max_bytes: int = DEFAULT_MAX_BYTES,
    **kwargs: Any,
) -> HttpAnswer:
    """``client.request(method, url, **kwargs)``, the answer read whole within ``total_s``
    and ``max_bytes`` (after decoding: a compressed answer counts as it unpacks).

    Raises :class:`AnswerRefused` past either, and httpx's errors as ``request`` does.
    """
    deadline = time.monotonic() + total_s
    kwargs.setdefault("timeout", total_s)
    with client.stream(method, url, **kwargs) as response:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise AnswerRefused(f"{url} answered {int(declared)} bytes, more than the {max_bytes} read of an answer")
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise AnswerRefused(f"{url} answered more than the {max_bytes} bytes read of an answer")
            if time.monotonic() > deadline:
                raise AnswerRefused(f"{url} did not finish its answer within {total_s:g}s")
            chunks.append(chunk)
        return HttpAnswer(response.status_code, b"".join(chunks))


def quote(text: str, limit: int = QUOTE_CHARS) -> str:
    """At most ``limit`` printable characters of ``text``, on one line."""
    flat = "".join(c if c.isprintable() else " " for c in text.strip())
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
