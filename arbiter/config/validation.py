"""Reading a file of arbiter's into values with the line and column of each, and validating
them against a model: every error becomes a :class:`~arbiter.config.errors.Problem` at its
line, with a hint, and an unknown key gets the keys that the model takes there.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from arbiter.config.errors import ConfigError, Problem, did_you_mean
from arbiter.config.models import KindBlock
from arbiter.config.yamlpos import Path_, Positions, anchor_of, load_with_positions

M = TypeVar("M", bound=BaseModel)

_HINTS = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": "add it",
    "float_parsing": "write a number",
    "int_parsing": "write a whole number",
    "bool_parsing": "write true or false",
    "string_type": "write text (quote it if it looks like a number)",
    "list_type": "write a list, e.g. [a, b]",
    "dict_type": "write a mapping of key: value lines",
    "model_type": "write a mapping of key: value lines",
    "literal_error": "use one of the values listed",
    "string_pattern_mismatch": "use letters, digits, '.', '_' and '-', starting with a letter or digit",
}


def field_path(loc: Iterable[str | int]) -> str:
    return ".".join(str(part) for part in loc)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, or inside Optional, a union, a list or a dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def known_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys a model takes at ``loc`` (the mapping that holds the last part of it)."""
    models = [model]
    for part in loc[:-1]:
        inner = [
            m
            for current in models
            for name, info in current.model_fields.items()
            if part in (name, info.alias)
            for m in _models_in(info.annotation)
        ]
        if inner:
            models = inner  # a field; else a list index or a mapping's key: the same models hold
    return sorted({info.alias or name for m in models for name, info in m.model_fields.items()})


def problems_from(
    exc: ValidationError,
    filename: str,
    positions: Positions,
    prefix: Path_ = (),
    origins: Mapping[Path_, str] | None = None,
    model: type[BaseModel] | None = None,
) -> list[Problem]:
    """Each validation error as a Problem at its line.  ``origins`` (a position's key → the
    file it is in) is for a rule merged from several files: each problem then names the file
    that holds the value, so the user edits the right one.  With the ``model`` validated, a key
    it does not take gets the keys it does take, the closest first."""
    out = []
    for err in exc.errors(include_url=False):
        own = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # unions report each alternative under a type tag; it means nothing to a user
        own = tuple(p for p in own if p not in ("str", "KindBlock", "list[str]"))
        loc: Path_ = (*prefix, *own)
        anchor = anchor_of(positions, loc, prefer_key=err["type"] == "extra_forbidden")
        line, col = positions.get(anchor, (1, 1))
        where = origins.get(anchor, filename) if origins else filename
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        hint = _HINTS.get(err["type"], "")
        if err["type"] == "extra_forbidden" and model is not None and own:
            keys = [k for k in known_keys(model, own) if k != "kind"]
            message = f"unknown key {own[-1]!r}"
            hint = did_you_mean(str(own[-1]), keys, "known keys here") if keys else "it takes no options: remove it"
            if keys and not hint.startswith("did you mean"):
                hint = f"remove it; {hint}"
        out.append(Problem(where, line, col, field_path(loc), message, hint))
    return sorted(out, key=lambda p: (p.line, p.column))


def validate(
    model: type[M],
    data: Any,
    filename: str,
    positions: Positions,
    prefix: Path_ = (),
    origins: Mapping[Path_, str] | None = None,
) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from(exc, filename, positions, prefix, origins, model)) from None


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        before = exc.object[: exc.start]
        line, col = before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1
        raise ConfigError(
            [
                Problem(
                    str(path),
                    line,
                    col,
                    "",
                    f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})",
                    "save the file as UTF-8",
                )
            ]
        ) from None
    except OSError as exc:
        raise ConfigError([Problem(str(path), 0, 0, "", f"cannot read: {exc.strerror or exc}")]) from None


def load_yaml_mapping(text: str, filename: str) -> tuple[dict[str, Any], Positions]:
    data, positions = load_with_positions(text, filename)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([Problem(filename, 1, 1, "", "expected a mapping of key: value lines at the top")])
    return data, positions


def validate_kind_options(block: KindBlock, model: type[M]) -> M:
    """Stage two: a block's options against its kind's model (which may declare ``kind`` too)."""
    options = block.options()
    if "kind" in model.model_fields:
        options["kind"] = block.kind
    return model.model_validate(options)
