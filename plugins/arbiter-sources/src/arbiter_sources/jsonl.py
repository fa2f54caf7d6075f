"""``jsonl``: progress and phase from a JSON-lines file a protected program writes.

Progress counts the lines whose ``event`` (or ``event_key``, a dotted path) equals ``event``;
a phase comes from ``enter``/``exit``/``enter_soon`` events, or from ``event`` + ``field`` +
``on``/``soon`` values.  Lines that are not JSON objects are counted and skipped.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from arbiter.plugin import Phase, PluginContext
from arbiter_sources.follow import FollowedFile, LineMeaning
from arbiter_sources.follow_path import FollowOptions

#: what ``bytes.strip()`` strips (ASCII white space), for a line stripped as text
_BLANK = " \t\n\r\x0b\x0c"


class _Decoder(json.JSONDecoder):
    """The standard decoder, with the scanner its ``__init__`` sets declared (the stubs
    leave that attribute out): ``scan_once(text, index)`` is ``(value, end index)``."""

    scan_once: Callable[[str, int], tuple[Any, int]]


def _text(value: Any) -> str | None:
    """A JSON value as rule files spell it, for comparison with a string from YAML."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return None


def _lookup(obj: dict[str, Any], dotted: str, parts: tuple[str, ...]) -> Any:
    """``obj["a"]["b"]`` for ``"a.b"``; a key that itself contains the dots wins."""
    if dotted in obj:
        return obj[dotted]
    value: Any = obj
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


#: two objects side by side in one line, with nothing but a comma between them
_TWO_OBJECTS = re.compile(r"\}[ \t\r]*,[ \t\r]*\{")


def _count_at_once(text: str, event: str, key: str, parts: tuple[str, ...]) -> int | None:
    """The lines of ``text`` whose event is ``event``, read as one JSON array in one call of
    the decoder (a program logging ten thousand lines a second kept this source's thread
    busy mostly in the calls around each line's parse); None, to have each line read in
    turn, unless every line gives one JSON object.  That is so when the array holds as
    many objects as there are lines and no line holds two objects side by side: a raw line
    end is never inside a JSON string, so each comma put between two lines either parts two
    objects of the array or lies inside one (a line left open, closed by a later one), and
    only a line of two objects could make up for the object that one lacks."""
    if _TWO_OBJECTS.search(text) is not None:
        return None
    try:
        values = json.loads("[" + text.replace("\n", "\n,") + "]")
    except (ValueError, RecursionError):
        return None
    if len(values) != text.count("\n") + 1 or set(map(type, values)) != {dict}:
        return None
    if len(parts) > 1:
        names = [_lookup(v, key, parts) for v in values]
    else:
        names = list(map(dict.get, values, repeat(key)))
    if set(map(type, names)) <= {str, type(None)}:
        return names.count(event)
    return sum(1 for name in names if name == event or (name is not None and _text(name) == event))


#: a line's shape: its digits 1 to 9 all made 1 (0 stays 0: a number may not start with 0)
_ONES = bytes.maketrans(b"23456789", b"11111111")
#: a batch of fewer lines than this has its lines read each, not by their shapes; a batch
#: whose first this many lines have more than a quarter as many shapes too
_SHAPES_FROM = 32
#: a batch's first lines looked at before the rest: a batch whose first this many lines
#: are at most a quarter as many shapes is read by its shapes at once, one whose first this
#: many are more than three quarters as many is read line by line at once (its first
#: ``_SHAPES_FROM`` are seldom a quarter as many)
_SHAPES_GLANCE = 8


def _shape_blind(event: str, key: str) -> bool:
    """Whether lines that differ only in which of the digits 1 to 9 they hold (and hold no
    escape) all mean the same to a count of ``event`` at ``key``: so when neither names a
    digit from 1 to 9 and no number or constant reads as ``event`` (a number compares as
    written, :func:`_text`).  In JSON's grammar those digits stand in each other's places:
    in a number (whose first digit is 0 or one of them), in a string (which, without an
    escape, holds them as they are), so a line and its shape are both JSON or both not,
    with the same keys where no key holds such a digit, and the same value of ``key``
    wherever that is a string or compares unlike ``event``."""
    if set("123456789") & set(event + key) or event in ("true", "false"):
        return False
    try:
        float(event)
    except ValueError:
        return True
    return False


def _tally(
    scan: Callable[[str, int], tuple[Any, int]],
    lines: Iterable[tuple[str, int]],
    event: str,
    key: str,
    parts: tuple[str, ...],
) -> tuple[int, int]:
    """(the lines that count, the malformed lines) of ``lines``, each ``(text, how many
    such lines)``, each read alone as :meth:`JsonlSource.match_line` reads it."""
    dotted = len(parts) > 1
    units = malformed = 0
    for line, times in lines:
        line = line.strip(_BLANK)
        if not line:
            continue
        try:
            value, end = scan(line, 0)
        except (StopIteration, ValueError, RecursionError):
            malformed += times
            continue
        if end != len(line) or type(value) is not dict:
            malformed += times
            continue
        name = _lookup(value, key, parts) if dotted else value.get(key)
        if name == event or (name is not None and type(name) is not str and _text(name) == event):
            units += times
    return units, malformed


class JsonlOptions(FollowOptions):
    """``{kind: jsonl, path, event, ...}``: a progress form or a phase form, not both."""

    kind: Literal["jsonl"] = "jsonl"
    event: str | None = Field(
        None,
        description="progress form: count the lines whose event is this; with field: the event whose lines carry the phase",
    )
    event_key: str = Field("event", description="the dotted path of the key that holds a line's event name")
    enter: str | None = Field(None, description="phase form: the event that begins the phase (needs exit)")
    exit: str | None = Field(None, description="the event that ends the phase")
    enter_soon: str | None = Field(
        None, description="the event that announces the phase (soon: new work waits, running work goes on)"
    )
    field: str | None = Field(
        None, description="phase form: the dotted path, in event's lines, of the value compared with on and soon"
    )
    on: list[str] = Field([], description="values of field that mean the phase is on")
    soon: list[str] = Field([], description="values of field that mean the phase is coming soon")

    @field_validator("on", "soon", mode="before")
    @classmethod
    def _values_as_text(cls, value: Any) -> Any:
        # YAML reads `on: [1, true]` as numbers and booleans; compare them as written.
        if not isinstance(value, list):
            value = [value]
        return [_text(v) if not isinstance(v, str) and _text(v) is not None else v for v in value]

    @field_validator("event_key", "field")
    @classmethod
    def _dotted(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(not part for part in value.split("."))):
            raise ValueError(f"{value!r} is not a dotted field path (like state.phase)")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> JsonlOptions:
        by_events = [n for n in ("enter", "exit", "enter_soon") if getattr(self, n) is not None]
        if self.field is not None:
            if by_events:
                raise ValueError(
                    "field/on/soon and enter/exit/enter_soon are two ways to give a phase; use one "
                    f"(this block has field and {', '.join(by_events)})"
                )
            if self.event is None:
                raise ValueError(
                    "field needs event: the event whose lines carry the field (e.g. event: status, field: state.phase)"
                )
            if not self.on:
                raise ValueError("field needs on: the values that mean the phase is on")
            both = set(self.on) & set(self.soon)
            if both:
                raise ValueError(f"values cannot be both on and soon: {', '.join(sorted(both))}")
        elif self.on or self.soon:
            raise ValueError("on and soon need field: the dotted path of the value they are compared with")
        elif by_events:
            if self.event is not None:
                raise ValueError(
                    "event counts progress while enter/exit/enter_soon give a phase; use two sources, one for each"
                )
            if self.enter is None or self.exit is None:
                raise ValueError("a phase from events needs both enter and exit (enter_soon is optional)")
            names = [self.enter, self.exit] + ([self.enter_soon] if self.enter_soon is not None else [])
            if len(set(names)) != len(names):
                raise ValueError("enter, exit and enter_soon must be different events")
        elif self.event is None:
            raise ValueError(
                "give event (to count progress), event + field + on (a phase from a field's value), "
                "or enter + exit (a phase from events)"
            )
        return self

    def gives_phase(self) -> bool:
        return self.field is not None or self.enter is not None


class JsonlSource(FollowedFile):
    """Follows one JSON-lines file (or the newest file a glob matches)."""

    kind = "jsonl"
    Options = JsonlOptions

    def __init__(self, options: JsonlOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: JsonlOptions = options
        self._key_parts = tuple(options.event_key.split("."))
        self._field_parts = tuple(options.field.split(".")) if options.field else ()
        self._phase_events: dict[str, Phase] = {}
        if options.enter is not None and options.exit is not None:
            self._phase_events = {options.enter: "on", options.exit: "off"}
            if options.enter_soon is not None:
                self._phase_events[options.enter_soon] = "soon"
        self._on = frozenset(options.on)
        self._soon = frozenset(options.soon)
        self._history_needles = self._needles()
        self._by_shape = options.event is not None and _shape_blind(options.event, options.event_key)
        # The decoder's own scanner, called on each line's text: json.loads spends more
        # than twice as long per line (it guesses the encoding, then looks for trailing
        # whitespace in Python), and a program that logs ten thousand lines a second kept
        # this source's thread, and so the interpreter, busy mostly there.
        self._scan = _Decoder().scan_once

    def match_line(self, line: bytes) -> LineMeaning:
        obj = self._parsed(line)
        if not isinstance(obj, dict):
            return None
        return self._classify(obj)

    def _parsed(self, line: bytes) -> Any:
        """The JSON value of one stripped line, as json.loads reads it; None when it is not
        JSON."""
        try:
            text = line.decode()
        except UnicodeDecodeError:
            text = ""
        # json.loads also reads UTF-16 and UTF-32 (told by NULs in the first bytes) and
        # skips a UTF-8 byte-order mark: such a line is left to it
        if not text or text[0] == "\ufeff" or "\0" in text[:2]:
            try:
                return json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: arrays or objects nested thousands deep
                return None
        try:
            value, end = self._scan(text, 0)
        except (StopIteration, ValueError, RecursionError):
            return None
        return value if end == len(text) else None

    def _classify(self, obj: dict[str, Any]) -> tuple[bool, Phase | None]:
        """(is it a line this source looks for, the phase it sets)."""
        name = _text(_lookup(obj, self.options.event_key, self._key_parts))
        if name is None:
            return False, None
        if self._phase_events:
            phase = self._phase_events.get(name)
            return phase is not None, phase
        if name != self.options.event:
            return False, None
        if self.options.field is None:
            return True, None
        value = _text(_lookup(obj, self.options.field, self._field_parts))
        if value in self._on:
            return True, "on"
        if value in self._soon:
            return True, "soon"
        return True, "off"

    def count_lines(self, lines: list[bytes]) -> tuple[int, int] | None:
        """A progress source's lines matched in one loop, each as :meth:`match_line` matches
        it: their text decoded at once, each line scanned, its event looked up, and no call
        per line beyond the scanner's (a program logging ten thousand lines a second spent
        most of this thread's time in the calls around each parse); lines that differ only in
        their digits 1 to 9 read once for all (:func:`_shape_blind`).  A batch with a line that
        json.loads would read in another encoding (a NUL, a byte-order mark, bytes that are
        not UTF-8) is matched line by line."""
        o = self.options
        if o.event is None or o.field is not None or self._phase_events:
            return None
        joined = b"\n".join(lines)
        try:
            text = joined.decode()
        except UnicodeDecodeError:
            return None
        if "\0" in text or "\ufeff" in text:
            return None
        scan, event, key, parts = self._scan, o.event, o.event_key, self._key_parts
        if self._by_shape and len(lines) >= _SHAPES_FROM and "\\" not in text:
            # Progress lines differ mostly in their numbers (a step, a count): lines of one
            # shape mean the same, so each shape is read once, however many lines have it.
            # The first lines tell whether that is worth it: lines that each have a shape of
            # their own (a float with its every digit written, say) are read as before.  A
            # glance at the first few tells most batches apart, so a batch of floats is not
            # looked at twice: a quarter as many shapes as lines there, or more than three
            # quarters.
            head = b"\n".join(lines[:_SHAPES_GLANCE]).translate(_ONES).split(b"\n")
            by_shape = 4 * len(set(head)) <= _SHAPES_GLANCE
            if not by_shape and 4 * len(set(head)) <= 3 * _SHAPES_GLANCE:
                head += b"\n".join(lines[_SHAPES_GLANCE:_SHAPES_FROM]).translate(_ONES).split(b"\n")
                by_shape = 4 * len(set(head)) <= _SHAPES_FROM
            shapes = joined.translate(_ONES).split(b"\n") if by_shape else []
            if shapes and 4 * len(set(shapes)) <= len(shapes):
                return _tally(scan, ((s.decode(), n) for s, n in Counter(shapes).items()), event, key, parts)
        counted = _count_at_once(text, event, key, parts)
        if counted is not None:
            return counted, 0
        return _tally(scan, zip(text.split("\n"), repeat(1)), event, key, parts)

    def _needles(self) -> tuple[bytes, ...]:
        # Event names as they appear in a raw line, to skip most history lines unparsed.
        # A name JSON would escape may appear differently, so then every line is parsed.
        names = list(self._phase_events) or ([self.options.event] if self.options.event else [])
        needles = []
        for n in names:
            if not n.isascii() or '"' in n or "\\" in n:
                return ()
            needles.append(json.dumps(n).encode())
        return tuple(needles)
