"""How the long-running commands log: plain lines for a terminal, or JSON lines for a
collector (``--log-format json``), one object per record on stderr."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: libraries that log every request they make at INFO (a busy probe asks every second):
#: their warnings and errors still show
CHATTY = ("httpx", "httpcore")


class JsonFormatter(logging.Formatter):
    """time (RFC 3339, UTC), level, logger, message, and exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # a message with a newline stays one line: json escapes it
        return json.dumps(entry, default=str)


def configure(fmt: str, level: int = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Give the root logger one handler in ``fmt`` (replacing any it had)."""
    if fmt not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    return handler
