"""Busy probes that read a value a server gives about itself.

``http_value`` reads a number, a boolean or a string at a dotted ``field`` of a JSON answer
(``{"running": 0}``, ``{"is_sleeping": true}``), or at that field of each item of a list
(``*.is_processing`` of ``[{"is_processing": false}, ...]``: busy while any item's compares
true); ``prometheus`` sums the samples of the
Prometheus text exposition format (``/metrics``) that its ``metrics`` selectors pick
(``vllm:num_requests_running``, ``foo{model="x"}``), parsed with ``prometheus_client``'s own
parser.  Both compare what they read with ``busy_when`` (``"> 0"``, ``"== true"``...), and
both are corroborated by the VRAM the tenant holds as ``http_count`` is (``vram_floor_gb``,
``stale_after_s``).  An answer of the wrong shape leaves the state unknown, which counts as
busy, and the status says what was wrong (```running` is a string, expected a number``).
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from arbiter.plugin import PluginContext
from arbiter_sources.http_count import Answer, HttpProbe, HttpProbeOptions, _dotted, json_answer, lookup

_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_ORDERING = (">=", "<=", ">", "<")


@dataclass(frozen=True)
class Comparison:
    """``busy_when``: an operator and the literal it compares with (a number, a boolean or
    a string)."""

    op: str
    literal: float | bool | str

    @property
    def expects(self) -> str:
        if isinstance(self.literal, bool):
            return "a boolean"
        return "a number" if isinstance(self.literal, float) else "a string"

    def holds(self, value: Any, name: str) -> bool:
        """Whether ``value`` (read at ``name``) makes the tenant busy; ValueError when it is
        not of the literal's type."""
        if isinstance(self.literal, bool):
            ok = isinstance(value, bool)
        elif isinstance(self.literal, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ValueError(f"{name!r} is {_kind_of(value)}, expected {self.expects} (busy_when {self})")
        return _OPERATORS[self.op](value, self.literal)

    def __str__(self) -> str:
        lit = self.literal
        shown = str(lit).lower() if isinstance(lit, bool) else (f"{lit:g}" if isinstance(lit, float) else lit)
        return f"{self.op} {shown}"


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def parse_comparison(text: str) -> Comparison:
    """``"> 0"``, ``"== true"``, ``"!= idle"``; ValueError says what a comparison looks like."""
    body = text.strip()
    op = next((o for o in _OPERATORS if body.startswith(o)), None)
    if op is None:
        raise ValueError(
            f"busy_when {text!r} does not start with a comparison: write one of "
            f"{', '.join(_OPERATORS)} and a value, e.g. '> 0' or '== true'"
        )
    rest = body[len(op) :].strip()
    if not rest:
        raise ValueError(f"busy_when {text!r} has nothing to compare with after {op}")
    literal: float | bool | str
    if rest in ("true", "false"):
        literal = rest == "true"
    else:
        try:
            literal = float(rest)
            if not math.isfinite(literal):
                raise ValueError
        except ValueError:
            literal = rest[1:-1] if len(rest) >= 2 and rest[0] == rest[-1] and rest[0] in "'\"" else rest
    if op in _ORDERING and not isinstance(literal, float):
        raise ValueError(f"busy_when {text!r}: {op} compares numbers; for a boolean or a string use == or !=")
    return Comparison(op, literal)


class _ValueOptions(HttpProbeOptions):
    busy_when: str = Field("> 0", description="the comparison that makes it busy: '> 0', '== true', '!= idle'...")

    @field_validator("busy_when")
    @classmethod
    def _comparison(cls, value: str) -> str:
        parse_comparison(value)
        return value


class HttpValueOptions(_ValueOptions):
    """``{kind: http_value, url, field, busy_when}``: busy while the value at field compares true."""

    kind: Literal["http_value"] = "http_value"
    field: str = Field(
        description=(
            "the dotted path of the value in the JSON answer, e.g. is_sleeping or stats.running; a * step "
            "takes each item of a list (*.is_processing: busy while any item's compares true)"
        )
    )

    @field_validator("field")
    @classmethod
    def _field(cls, value: str) -> str:
        if value.split(".").count("*") > 1:
            raise ValueError(f"{value!r} has more than one * step: it reads the items of one list")
        return _dotted(value)


class HttpValueSource(HttpProbe):
    """Reads one value of a JSON answer and compares it with ``busy_when``."""

    Options = HttpValueOptions

    def __init__(
        self, options: HttpValueOptions, context: PluginContext, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(options, context, clock)
        self.options: HttpValueOptions = options
        self._compare = parse_comparison(options.busy_when)

    def parse(self, text: str) -> Answer:
        doc = json_answer(text)
        name = self.options.field
        if "*" in name.split("."):
            return self._each(doc, name)
        return _answer(self._compare, _value(doc, name), name)

    def _each(self, doc: Any, name: str) -> Answer:
        """Busy while the value at the rest of ``name`` of any item of the list at its ``*``
        compares true (an empty list: idle)."""
        head, _, rest = name.partition("*")
        items = doc if not head else _value(doc, head.rstrip("."))
        if not isinstance(items, list):
            raise ValueError(f"{head.rstrip('.') or 'the answer'} is {_kind_of(items)}, expected a list ({name!r})")
        field = rest.lstrip(".")
        values = [item if not field else _value(item, field) for item in items]
        busy = sum(1 for i, value in enumerate(values) if self._compare.holds(value, f"{head}{i}{rest}"))
        shown = f"{busy} of {len(values)}"
        return Answer(busy, shown, (), f"{shown} {name} compare {self._compare}, busy when any does")


def _value(doc: Any, name: str) -> Any:
    """The value at ``name``; ValueError names what is missing, and the nearest key."""
    try:
        return lookup(doc, name)
    except KeyError:
        keys = list(doc) if isinstance(doc, dict) else []
        near = difflib.get_close_matches(name, keys, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else (f"; it has {', '.join(keys[:8])}" if keys else "")
        raise ValueError(f"the answer has no {name!r}{hint}") from None


def _answer(compare: Comparison, value: Any, name: str) -> Answer:
    busy = compare.holds(value, name)
    shown = json.dumps(value)
    return Answer(1 if busy else 0, shown, (), f"{name} is {shown}, busy when {compare}")


# --- Prometheus ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """A metric name with label matchers (``name{label="value"}``): every sample with that
    name whose labels include these."""

    name: str
    labels: tuple[tuple[str, str], ...]

    def picks(self, name: str, labels: dict[str, str]) -> bool:
        return name == self.name and all(labels.get(k) == v for k, v in self.labels)


def parse_selector(text: str) -> Selector:
    """``vllm:num_requests_running{model_name="m"}`` → its name and labels, read by the same
    parser as the answers (a selector is a sample line without its value)."""
    from prometheus_client.parser import text_string_to_metric_families

    body = text.strip()
    if not body or "\n" in body or body.startswith("#"):
        raise ValueError(f'{text!r} is not a metric selector (like vllm:num_requests_running or foo{{a="b"}})')
    try:
        families = list(text_string_to_metric_families(f"{body} 0\n"))
    except (ValueError, IndexError, KeyError) as exc:
        raise ValueError(
            f'{text!r} is not a metric selector (like vllm:num_requests_running or foo{{a="b"}}): {exc}'
        ) from None
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1:
        raise ValueError(f"{text!r} is not one metric selector")
    sample = samples[0]
    inside = body.partition("{")[2].rpartition("}")[0].strip()
    if inside and not sample.labels:  # the parser is lenient: a matcher it dropped is a typo
        raise ValueError(f'{text!r} is not a metric selector: its labels {{{inside}}} are not label="value" pairs')
    return Selector(sample.name, tuple(sorted(sample.labels.items())))


class PrometheusOptions(_ValueOptions):
    """``{kind: prometheus, url, metrics, busy_when}``: busy while the selected samples' sum compares true."""

    kind: Literal["prometheus"] = "prometheus"
    metrics: list[str] = Field(
        min_length=1,
        description='metric names, each with optional label matchers (name{label="value"}); their samples are summed',
    )
    missing: Literal["unknown", "zero"] = Field(
        "unknown",
        description=(
            "a selector no sample of an answer matches: unknown (counts as busy), or zero, for a server that "
            "publishes a gauge only once it has a value (the page itself must still answer)"
        ),
    )

    @field_validator("metrics")
    @classmethod
    def _selectors(cls, value: list[str]) -> list[str]:
        for v in value:
            parse_selector(v)
        return value

    @field_validator("busy_when")
    @classmethod
    def _numeric(cls, value: str) -> str:
        if not isinstance(parse_comparison(value).literal, float):
            raise ValueError(f"busy_when {value!r}: a sum of samples is a number; compare it with one, e.g. '> 0'")
        return value


class PrometheusSource(HttpProbe):
    """Sums the samples its selectors pick from a ``/metrics`` answer and compares the sum."""

    Options = PrometheusOptions
    accept = "text/plain;version=0.0.4"

    def __init__(
        self, options: PrometheusOptions, context: PluginContext, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(options, context, clock)
        self.options: PrometheusOptions = options
        self._compare = parse_comparison(options.busy_when)
        self._selectors = [parse_selector(m) for m in options.metrics]

    def parse(self, text: str) -> Answer:
        from prometheus_client.parser import text_string_to_metric_families

        found = [0] * len(self._selectors)
        total = 0.0
        names: set[str] = set()
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    names.add(sample.name)
                    for i, sel in enumerate(self._selectors):
                        if sel.picks(sample.name, sample.labels):
                            found[i] += 1
                            total += sample.value
        except (ValueError, IndexError, KeyError) as exc:
            raise ValueError(f"did not answer the Prometheus text format: {exc}") from None
        for sel, n, text_sel in zip(self._selectors, found, self.options.metrics, strict=True):
            if n == 0 and self.options.missing == "unknown":
                near = difflib.get_close_matches(sel.name, sorted(names), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near and near[0] != sel.name else ""
                labelled = " with those labels" if sel.name in names else ""
                raise ValueError(f"no sample of {text_sel!r}{labelled} in the answer{hint}")
        name = " + ".join(self.options.metrics)
        return _answer(self._compare, total if not total.is_integer() else int(total), name)
