"""The ``jsonl`` source against real files, real writers and the real watcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from arbiter.plugin import PluginContext, PluginError, SourceState
from arbiter_sources import JsonlSource, arbiter_register_sources, follow, follow_fs
from arbiter_sources import inotify as inotify_module
from arbiter_testing import run_as
from arbiter_testing.waiting import wait_until

Make = Callable[..., JsonlSource]


class Recorder:
    """Collects the states on_change hands over, and waits for one that fits."""

    def __init__(self) -> None:
        self.states: list[tuple[float, SourceState]] = []
        self._lock = threading.Lock()

    def __call__(self, state: SourceState) -> None:
        with self._lock:
            self.states.append((time.monotonic(), state))

    def latest(self) -> SourceState | None:
        with self._lock:
            return self.states[-1][1] if self.states else None

    def wait_for(self, fits: Callable[[SourceState], bool], timeout: float = 5.0) -> SourceState:
        """The latest state, once it fits (only the latest state counts)."""

        def fitting() -> SourceState | None:
            state = self.latest()
            return state if state is not None and fits(state) else None

        try:
            return wait_until(fitting, timeout, "a fitting state", poll_s=0.001)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; latest: {self.latest()}") from None


def caught_up(source: JsonlSource, path: Path) -> bool:
    """The source follows the file at ``path`` and has read it to its end: under its lock,
    all it read is counted and published."""
    with source._lock:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        return source._fd is not None and source._ident == (st.st_dev, st.st_ino) and source._pos == st.st_size


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    sources: list[JsonlSource] = []

    def build(**block: Any) -> JsonlSource:
        options = JsonlSource.Options.model_validate({"kind": "jsonl", **block})
        source = JsonlSource(options, PluginContext(state_dir=tmp_path))
        sources.append(source)
        return source

    yield build
    for source in sources:
        source.close()


def line(event: str, **fields: Any) -> str:
    return json.dumps({"t": time.time(), "event": event, **fields}) + "\n"


def append(path: Path, *texts: str) -> None:
    # One write per call, as a program's logger does, through O_APPEND.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(texts).encode())
    finally:
        os.close(fd)


def phase_is(phase: str) -> Callable[[SourceState], bool]:
    return lambda state: state.phase == phase


def started(source: JsonlSource) -> Recorder:
    rec = Recorder()
    source.start(rec)
    return rec


# --- options --------------------------------------------------------------------------------


def test_registers_every_source_kind() -> None:
    seen: dict[str, type] = {}
    arbiter_register_sources(lambda name, cls: seen.__setitem__(name, cls))
    assert seen["jsonl"] is JsonlSource and set(seen) == {
        "jsonl",
        "log",
        "exec",
        "on_exec",
        "http_count",
        "http_value",
        "prometheus",
        "vram",
        "websocket",
    }


@pytest.mark.parametrize(
    "block",
    [
        {"event": "step_done"},
        {"event": "status", "field": "state.phase", "on": ["uploading"], "soon": ["preparing"]},
        {"event": "status", "field": "phase", "on": "busy"},
        {"enter": "upload_start", "exit": "upload_end"},
        {"enter": "upload_start", "exit": "upload_end", "enter_soon": "upload_soon", "event_key": "meta.kind"},
    ],
)
def test_valid_blocks(block: dict[str, Any]) -> None:
    JsonlSource.Options.model_validate({"kind": "jsonl", "path": "~/events-*.jsonl", **block})


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({}, "give event"),
        ({"event": "s", "field": "p", "on": ["x"], "enter": "a"}, "two ways to give a phase"),
        ({"field": "p", "on": ["x"]}, "field needs event"),
        ({"event": "s", "field": "p"}, "field needs on"),
        ({"event": "s", "on": ["x"]}, "need field"),
        ({"event": "s", "enter": "a", "exit": "b"}, "use two sources"),
        ({"enter": "a"}, "needs both enter and exit"),
        ({"enter": "a", "exit": "a"}, "must be different"),
        ({"event": "s", "field": "p", "on": ["x"], "soon": ["x"]}, "both on and soon"),
        ({"event": "s", "event_key": "a..b"}, "dotted field path"),
        ({"event": "s", "path": "relative/file.jsonl"}, "absolute"),
        ({"event": "s", "path": "/var/log/*/events.jsonl"}, "last component"),
        ({"event": "s", "rate": 1}, "Extra inputs"),
    ],
)
def test_conflicting_or_incomplete_blocks_are_refused(block: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        JsonlSource.Options.model_validate({"kind": "jsonl", "path": "/tmp/events.jsonl", **block})


# --- progress -------------------------------------------------------------------------------


def test_progress_counts_only_lines_written_after_open(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("step_done"), line("step_done"), line("step_done"))
    source = make(path=str(path), event="step_done")
    rec = started(source)
    first = source.state()
    assert first.readable and first.count == 0 and first.phase is None
    append(path, line("step_done"), line("other"), line("step_done"))
    assert rec.wait_for(lambda s: s.count == 2).phase is None


def test_progress_from_a_real_writer_process(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    writer = (
        "import json, sys, time\n"
        "with open(sys.argv[1], 'a', buffering=1) as fh:\n"
        "    for i in range(50):\n"
        "        fh.write(json.dumps({'event': 'step_done', 'i': i}) + '\\n')\n"
        "        fh.write(json.dumps({'event': 'noise'}) + '\\n')\n"
        "        time.sleep(0.002)\n"
    )
    subprocess.run([sys.executable, "-c", writer, str(path)], check=True, timeout=60)
    assert rec.wait_for(lambda s: s.count == 50).readable
    assert source.malformed == 0


def test_dotted_event_key(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step", event_key="meta.kind")
    rec = started(source)
    append(
        path,
        json.dumps({"meta": {"kind": "step"}}) + "\n",
        json.dumps({"meta": {"kind": "other"}}) + "\n",
        json.dumps({"event": "step"}) + "\n",
        json.dumps({"meta.kind": "step"}) + "\n",
    )
    assert rec.wait_for(lambda s: s.count == 2).count == 2


# --- phases ---------------------------------------------------------------------------------


def test_phase_from_a_field_with_on_and_soon(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("status", state={"phase": "training"}))
    source = make(path=str(path), event="status", field="state.phase", on=["uploading"], soon=["preparing_upload"])
    rec = started(source)
    assert source.state().phase == "off"
    append(path, line("status", state={"phase": "preparing_upload"}))
    rec.wait_for(lambda s: s.phase == "soon")
    append(path, line("other", state={"phase": "training"}))  # another event: ignored
    append(path, line("status", state={"phase": "uploading"}))
    rec.wait_for(lambda s: s.phase == "on")
    append(path, line("status"))  # the field is missing: not on
    rec.wait_for(lambda s: s.phase == "off")


def test_phase_from_enter_exit_and_enter_soon(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), enter="upload_start", exit="upload_end", enter_soon="upload_soon")
    rec = started(source)
    assert source.state().phase == "off"
    for event, phase in [
        ("upload_soon", "soon"),
        ("upload_start", "on"),
        ("upload_end", "off"),
        ("upload_start", "on"),
    ]:
        append(path, line(event))
        rec.wait_for(phase_is(phase))


@pytest.mark.parametrize(
    ("history", "phase"),
    [
        (["upload_start"], "on"),
        (["upload_start", "upload_end"], "off"),
        (["upload_end", "upload_soon"], "soon"),
        ([], "off"),
    ],
)
def test_first_open_takes_the_phase_from_the_last_phase_line(
    tmp_path: Path, make: Make, history: list[str], phase: str
) -> None:
    path = tmp_path / "events.jsonl"
    filler = "".join(line("step_done", pad="x" * 200) for _ in range(2000))  # > 400 KiB after the phase line
    append(path, *(line(e) for e in history), filler, "{not json\n")
    source = make(path=str(path), enter="upload_start", exit="upload_end", enter_soon="upload_soon")
    state = source.state()
    assert state.readable and state.phase == phase and state.count == 0


def test_first_open_phase_from_a_field_form(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("status", state={"phase": "uploading"}), line("step_done"), line("step_done"))
    source = make(path=str(path), event="status", field="state.phase", on=["uploading"])
    assert source.state().phase == "on"


# --- how lines arrive -----------------------------------------------------------------------


def test_partial_lines_wait_for_their_newline(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    whole = line("status", state={"phase": "uploading"})
    append(path, whole[:10])  # a partial line already there at open completes later
    source = make(path=str(path), event="status", field="state.phase", on=["uploading"])
    rec = started(source)
    append(path, whole[10:25])
    wait_until(lambda: caught_up(source, path), 5, "the source to read the partial line")
    assert source.state().phase == "off" and source.malformed == 0
    append(path, whole[25:])
    rec.wait_for(lambda s: s.phase == "on" and s.count == 1)
    second = line("status", state={"phase": "idle"})
    append(path, second[:5])
    wait_until(lambda: caught_up(source, path), 5, "the source to read the start of a line")  # the rest comes later
    append(path, second[5:])
    rec.wait_for(lambda s: s.phase == "off")
    assert source.malformed == 0


def test_malformed_lines_are_counted_and_skipped(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    append(path, "{broken\n", "[1, 2]\n", "42\n", "\n", "   \n", line("step_done"), "\x00\xff garbage\n")
    rec.wait_for(lambda s: s.count == 1)
    wait_until(lambda: caught_up(source, path), 5, "the source to read every line")
    assert source.malformed == 4
    append(path, "x" * (2 << 20))  # a line too long to keep, still without its newline
    append(path, "tail of the long line\n", line("step_done"))
    rec.wait_for(lambda s: s.count == 2)
    assert source.malformed == 5


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def _lines(draw: st.DrawFn) -> bytes:
    """Lines a program might write, and what it might write by mistake: JSON in each
    encoding json.loads reads, with or without a byte-order mark, and cut or spliced."""
    text = json.dumps(draw(_JSON_VALUES), ensure_ascii=draw(st.booleans()))
    raw = text.encode(draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "utf-32"])))
    cut = draw(st.integers(0, len(raw)))
    raw = draw(st.sampled_from([raw, raw[:cut], raw[:cut] + draw(st.binary(max_size=4)) + raw[cut:], raw + b" 1"]))
    return draw(st.one_of(st.just(raw), st.binary(max_size=12)))


@settings(max_examples=2000, deadline=None)
@given(_lines())
def test_a_line_reads_as_json_loads_reads_it(raw: bytes) -> None:
    # the source parses each line with the decoder's scanner, not json.loads: it must take
    # and refuse exactly the lines json.loads does, and read the same value from them
    source = JsonlSource(
        JsonlSource.Options(path="/nonexistent/events.jsonl", event="step_done"), PluginContext(state_dir=Path("."))
    )
    stripped = raw.strip()
    if not stripped:
        return  # an empty line never reaches the parser
    try:
        expected = json.loads(stripped)
    except (ValueError, RecursionError):
        expected = None
    assert repr(source._parsed(stripped)) == repr(expected)  # repr: NaN equals itself there


def test_a_line_nested_too_deep_or_with_a_mark_in_front_is_read_as_json_loads_reads_it(
    make: Make, tmp_path: Path
) -> None:
    source = make(path=str(tmp_path / "events.jsonl"), event="step_done")
    assert source._parsed(b"[" * 100_000 + b"]" * 100_000) is None
    assert source._parsed(b'\xef\xbb\xbf{"event": "step_done"}') == {"event": "step_done"}
    assert source.match_line('{"event": "step_done"}'.encode("utf-16")) == (True, None)
    assert source._parsed(b'{"event": "step_done"} {}') is None


def test_progress_lines_are_counted_without_a_call_per_line(tmp_path: Path, make: Make) -> None:
    # ten thousand lines a second kept this thread busy mostly in the Python calls around
    # each line's parse: a batch of progress lines now costs a few calls, not several a line
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    source.start(lambda state: None)
    texts = [json.dumps({"t": 1.7e9 + i / 7, "event": "step_done", "step": i}) + "\n" for i in range(1000)]
    texts[500] = json.dumps({"event": "eval", "step": 500}) + "\n"
    texts[700] = "{not json\n"
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event == "call"

    with source._lock:  # the watcher thread waits: this thread reads
        sys.setprofile(count)
        try:
            source._feed("".join(texts).encode())
        finally:
            sys.setprofile(None)
    assert source._count == 998 and source.malformed == 1
    assert calls < 50


def test_well_formed_progress_lines_are_parsed_in_one_go(tmp_path: Path, make: Make) -> None:
    # a call of the parser a line (and of strip and the rest around it) was most of what a
    # program logging ten thousand lines a second cost: well-formed lines take a few calls
    source = make(path=str(tmp_path / "events.jsonl"), event="step_done")
    lines = [json.dumps({"t": 1.7e9 + i / 7, "event": "step_done", "step": i}).encode() for i in range(1000)]
    lines[500] = json.dumps({"event": "eval", "step": 500}).encode()
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        counted = source.count_lines(lines)
    finally:
        sys.setprofile(None)
    assert counted == (999, 0)
    assert calls < 50


def test_lines_that_glue_together_into_as_many_objects_are_read_each_alone(tmp_path: Path, make: Make) -> None:
    # a line left open and closed by the next, made up for by a line of two objects: read
    # as one array they make an object a line, but no line alone is one
    source = make(path=str(tmp_path / "events.jsonl"), event="step_done")
    for lines in (
        [b'{"event": "step_done", "x": [{}', b"{}]}", b'{"event": "step_done"},{}'],
        [b'{"event": "step_done", "x": [{}', b"{}]}", b'{"event": "step_done"} \t, {}'],
        [b'{"event": "step_done"}', b"", b'{"event": "step_done"}'],
        [b'  {"event": "step_done"}\r', b'{"event": "step_done"}'],
    ):
        assert source.count_lines(lines) == _meaning_one_by_one(source, lines), lines


def _meaning_one_by_one(source: JsonlSource, lines: list[bytes]) -> tuple[int, int]:
    units = malformed = 0
    for raw in lines:
        stripped = raw.strip()
        if not stripped:
            continue
        meaning = source.match_line(stripped)
        if meaning is None:
            malformed += 1
        elif meaning[0]:
            units += 1
    return units, malformed


_DIGITS = st.sampled_from(list("0123456789"))


@st.composite
def _progress_lines(draw: st.DrawFn) -> list[bytes]:
    """Lines as a progress writer and its mistakes make them, and lines of any JSON."""
    templates = [
        '{"event": "step_done", "step": #, "loss": #.#e-#}',
        '{"event": "step_done", "event": "eval#"}',
        '{"event": "eval#", "event": "step_done"}',
        '{"event#": "step_done", "n": -0#}',
        '{"meta": {"kind": "step_done"}, "meta.kind": #}',
        '{"meta.kind": "step_done", "x": [#, #.#]}',
        '{"event": #e#, "s": "step_done"}',
        '{"event": "step_done", "n": 0#}',
        '  {"event" : "step_done"}\r',
        '{"event": "step_done"} #',
        "[#]",
        "#",
        "",
    ]
    out = []
    for _ in range(draw(st.integers(0, 12))):
        text = draw(st.sampled_from(templates))
        while "#" in text:
            text = text.replace("#", "".join(draw(st.lists(_DIGITS, min_size=1, max_size=3))), 1)
        out.append(text.encode())
    extra = draw(st.lists(_lines(), max_size=3))
    return out + [raw.replace(b"\n", b" ") for raw in extra]


@settings(max_examples=1500, deadline=None)
@given(
    _progress_lines(),
    st.sampled_from([("step_done", "event"), ("step_done", "meta.kind"), ("1", "event"), ("true", "event")]),
)
def test_lines_counted_at_once_count_as_each_line_alone(lines: list[bytes], form: tuple[str, str]) -> None:
    event, key = form
    source = JsonlSource(
        JsonlSource.Options(path="/nonexistent/events.jsonl", event=event, event_key=key),
        PluginContext(state_dir=Path(".")),
    )
    counted = source.count_lines(lines)
    if counted is None:  # a line json.loads reads in another encoding: each is matched in turn
        assert any(b"\0" in raw or b"\xef\xbb\xbf" in raw or not _utf8(raw) for raw in lines)
        return
    assert counted == _meaning_one_by_one(source, lines)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_progress_lines(), min_size=1, max_size=4),
    st.integers(1, 8),
    st.integers(32, 90),
    st.sampled_from([("step_done", "event"), ("step_done", "meta.kind"), ("0", "event"), ("1", "event")]),
)
def test_lines_counted_by_their_shapes_count_as_each_line_alone(
    drawn: list[list[bytes]], kinds: int, size: int, form: tuple[str, str]
) -> None:
    # batches long enough to be read by their shapes: the same lines again and again, their
    # digits moved about, as a step number moves
    event, key = form
    source = JsonlSource(
        JsonlSource.Options(path="/nonexistent/events.jsonl", event=event, event_key=key),
        PluginContext(state_dir=Path(".")),
    )
    pool = [raw for lines in drawn for raw in lines][:kinds] or [b'{"event": "step_done"}']
    lines = []
    for k in range(size):
        raw = pool[k % len(pool)]
        lines.append(raw.translate(bytes.maketrans(b"123456789", b"234567891")) if k % 3 else raw)
    counted = source.count_lines(lines)
    if counted is None:
        assert any(b"\0" in raw or b"\xef\xbb\xbf" in raw or not _utf8(raw) for raw in lines)
        return
    assert counted == _meaning_one_by_one(source, lines)


def test_progress_lines_of_one_shape_are_parsed_once(tmp_path: Path, make: Make) -> None:
    # ten thousand lines a second, alike but for their step numbers, were mostly the parse of
    # each; escapes, the event in another field and malformed numbers still count as each alone
    source = make(path=str(tmp_path / "events.jsonl"), event="step_done")
    lines = [json.dumps({"event": "step_done", "step": 1000 + i, "epoch": 3}).encode() for i in range(1000)]
    lines[10] = b'{"event": "step_d\\u006fne", "step": 1}'
    lines[20] = b'{"kind": "step_done", "event": "eval", "step": 2}'
    lines[30] = b'{"event": "step_done", "step": 012}'  # a number may not start with 0
    lines[40] = b'{"event": "step_done", "step": 12}'
    lines[50] = b'{"event": "step_done", "event": "eval"}'  # the last one counts, as in a dict
    lines[60] = b"{not json"
    assert source.count_lines(lines) == _meaning_one_by_one(source, lines) == (996, 2)
    del lines[10]  # without the escape: read by shapes
    scans = 0
    scan = source._scan

    def counted(text: str, at: int) -> tuple[Any, int]:
        nonlocal scans
        scans += 1
        return scan(text, at)

    source._scan = counted
    assert source.count_lines(lines) == (995, 2)
    assert scans < 30, f"{scans} parses for {len(lines)} lines of a few shapes"


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_a_phase_source_matches_its_lines_in_turn(make: Make, tmp_path: Path) -> None:
    source = make(path=str(tmp_path / "events.jsonl"), event="status", field="phase", on=["on"])
    assert source.count_lines([b'{"event": "status", "phase": "on"}']) is None


def test_crlf_line_endings(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    append(path, line("step_done").replace("\n", "\r\n"))
    rec.wait_for(lambda s: s.count == 1)
    assert source.malformed == 0


# --- following files ------------------------------------------------------------------------


def test_glob_follows_the_newest_file_and_switches_at_once(tmp_path: Path, make: Make) -> None:
    old = tmp_path / "events-1.jsonl"
    older = tmp_path / "events-0.jsonl"
    append(older, line("step_done"))
    append(old, line("step_done"))
    os.utime(older, (time.time() - 100, time.time() - 100))
    os.utime(old, (time.time() - 50, time.time() - 50))
    (tmp_path / "other.jsonl").touch()
    source = make(path=str(tmp_path / "events-*.jsonl"), event="step_done")
    rec = started(source)
    assert source.current_path == str(old) and source.state().count == 0
    append(old, line("step_done"))
    rec.wait_for(lambda s: s.count == 1)
    new = tmp_path / "events-2.jsonl"
    append(new, line("step_done"), line("step_done"))  # a new run: all its lines are new
    rec.wait_for(lambda s: s.count == 3)
    assert source.current_path == str(new)
    append(tmp_path / "other.jsonl", line("step_done"))  # not a match
    append(new, line("step_done"))
    rec.wait_for(lambda s: s.count == 4)


def test_truncation_starts_over_from_the_top(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("step_done") * 5)
    source = make(path=str(path), event="step_done")
    rec = started(source)
    append(path, line("step_done"), line("step_done"))
    rec.wait_for(lambda s: s.count == 2)
    os.truncate(path, 0)
    append(path, line("step_done"))
    rec.wait_for(lambda s: s.count == 3)
    with open(path, "w") as fh:  # truncated and rewritten in one go
        fh.write(line("step_done"))
    rec.wait_for(lambda s: s.count == 4)


def test_rename_rotation_finishes_the_old_file_then_reads_the_new_one(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    writer = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(writer, line("step_done").encode())
        rec.wait_for(lambda s: s.count == 1)
        os.rename(path, tmp_path / "events.jsonl.1")
        os.write(writer, line("step_done").encode())  # the writer has not reopened yet
        rec.wait_for(lambda s: s.count == 2)
        assert source.state().readable  # a rotation in progress is not a lost file
    finally:
        os.close(writer)
    append(path, line("step_done"), line("step_done"))
    rec.wait_for(lambda s: s.count == 4)
    assert source.current_path == str(path)
    append(tmp_path / "events.jsonl.1", line("step_done"))  # the old file is done with
    append(path, line("step_done"))
    rec.wait_for(lambda s: s.count == 5)
    wait_until(lambda: caught_up(source, path), 5, "the source to read the new file to its end")
    assert source.current_path == str(path) and source.state().count == 5  # the one file it follows


def test_a_new_file_replacing_the_path_is_read_from_its_start(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("step_done"))
    source = make(path=str(path), event="step_done")
    rec = started(source)
    replacement = tmp_path / "events.tmp"
    append(replacement, line("step_done"), line("step_done"), line("step_done"))
    os.replace(replacement, path)
    rec.wait_for(lambda s: s.count == 3)


def test_a_missing_file_is_unreadable_until_it_appears(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "later" / "events.jsonl"
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    rec = started(source)
    state = source.state()
    assert not state.readable and str(tmp_path / "later") in state.why and not state.needs_helper
    path.parent.mkdir()
    # the folder is there now: what is missing is the file
    wait_until(lambda: source.state().why.startswith(f"{path} does not exist yet"), 5, "the file named missing")
    append(path, line("status", phase="uploading"), line("step_done"))
    # Lines in a file that appeared after the source opened were written after it opened.
    assert rec.wait_for(lambda s: s.readable and s.phase == "on").count == 1


def test_a_missing_glob_match_is_read_when_it_appears(tmp_path: Path, make: Make) -> None:
    source = make(path=str(tmp_path / "events-*.jsonl"), event="step_done")
    rec = started(source)
    assert not source.state().readable and "no file matches" in source.state().why
    append(tmp_path / "events-9.jsonl", line("step_done"))
    assert rec.wait_for(lambda s: s.readable and s.count == 1)


def test_a_symlinked_file_is_watched_where_it_is_written(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no full check on an interval meanwhile: what is read was heard through a watch
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "events.jsonl"
    target.touch()
    link = tmp_path / "events.jsonl"
    link.symlink_to(target)
    source = make(path=str(link), event="step_done")
    rec = started(source)
    append(target, line("step_done"))
    rec.wait_for(lambda s: s.count == 1)  # seen through the watch on the target's directory


def test_a_directory_created_later_is_watched(tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    # checked on the poll interval while the folder is missing; once it is watched, no full
    # check on an interval: what is read was heard through a watch
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    path = tmp_path / "later" / "events.jsonl"
    source = make(path=str(path), event="step_done")
    rec = started(source)
    path.parent.mkdir()
    append(path, line("step_done"))
    rec.wait_for(lambda s: s.readable and s.count == 1)
    append(path, line("step_done"))
    rec.wait_for(lambda s: s.count == 2)


def test_a_file_watched_elsewhere_wakes_no_reader_here_and_is_read_at_once_when_that_ends(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process tells the daemon each change of the file, a write wakes nobody
    here (no safety check comes meanwhile: an hour apart); told that has ended, the source
    reads at once what came meanwhile."""
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    path, other = tmp_path / "events.jsonl", tmp_path / "other.jsonl"
    path.touch()
    other.touch()
    source = make(path=str(path), event="status", field="phase", on=["on"])
    beside = make(path=str(other), event="status", field="phase", on=["on"])
    source.watched_elsewhere(True)  # before it starts: its thread waits resting from the first
    rec, seen = started(source), started(beside)
    append(path, line("status", phase="on"))
    for phase in ("on", "off"):  # a source beside it, woken after it, has read twice meanwhile
        append(other, line("status", phase=phase))
        seen.wait_for(phase_is(phase))
    assert rec.latest() is None
    source.watched_elsewhere(False)
    rec.wait_for(phase_is("on"))
    append(path, line("status", phase="off"))  # and each write wakes it again
    rec.wait_for(phase_is("off"))


def test_a_file_watched_elsewhere_is_read_when_the_tick_asks(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other process may stall: the daemon's tick, asking the state, reads what came since
    (the safety checks are an hour apart), so what the tick reads is never older than a tick."""
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["on"])
    source.watched_elsewhere(True)
    rec = started(source)
    append(path, line("status", phase="on"))
    assert source.state().phase == "on"
    # and reported as the watcher reports it: the report the daemon sets aside is the newest
    assert rec.wait_for(phase_is("on"), timeout=0.1)
    path.rename(tmp_path / "events.jsonl.1")  # rotated: the new file at the path is followed
    append(path, line("status", phase="off"))
    assert source.state().phase == "off"
    assert rec.wait_for(phase_is("off"), timeout=0.1)


def test_a_file_watched_elsewhere_is_still_read_on_the_safety_check(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other process may stall: what the daemon's tick reads stays at most a safety
    interval old."""
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 0.05)
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["on"])
    rec = started(source)
    source.watched_elsewhere(True)
    append(path, line("status", phase="on"))
    rec.wait_for(phase_is("on"))


def test_a_deleted_file_is_unreadable(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("step_done"))
    source = make(path=str(path), event="step_done")
    rec = started(source)
    path.unlink()
    assert str(path) in rec.wait_for(lambda s: not s.readable).why


def test_a_directory_at_the_path_is_unreadable(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.mkdir()
    state = make(path=str(path), event="step_done").state()
    assert not state.readable and "is a directory" in state.why and str(path) in state.why


def _state_as_nobody(block: dict[str, Any]) -> SourceState:
    """The source's state as read by an account that is not root."""

    def read() -> list[Any]:
        options = JsonlSource.Options.model_validate({"kind": "jsonl", **block})
        state = JsonlSource(options, PluginContext(state_dir=Path("/"))).state()
        return [state.readable, state.why, state.needs_helper]

    readable, why, needs_helper = run_as("nobody", read)
    return SourceState(readable=readable, why=why, needs_helper=needs_helper)


def test_a_file_it_may_not_read_needs_a_helper(tmp_path: Path, make: Make) -> None:
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="arbiter-jsonl-"))
    try:
        home.chmod(0o755)
        private = home / "events.jsonl"
        append(private, line("step_done"))
        private.chmod(0o600)
        hidden_dir = home / "private"
        hidden_dir.mkdir(mode=0o700)
        append(hidden_dir / "events.jsonl", line("step_done"))
        if os.geteuid() == 0:
            states = [
                _state_as_nobody({"path": str(private), "event": "step_done"}),
                _state_as_nobody({"path": str(hidden_dir / "events.jsonl"), "event": "step_done"}),
                _state_as_nobody({"path": str(hidden_dir / "events-*.jsonl"), "event": "step_done"}),
            ]
        else:
            private.chmod(0)
            hidden_dir.chmod(0)
            states = [
                make(path=str(private), event="step_done").state(),
                make(path=str(hidden_dir / "events.jsonl"), event="step_done").state(),
                make(path=str(hidden_dir / "events-*.jsonl"), event="step_done").state(),
            ]
            hidden_dir.chmod(0o700)
        for state in states:
            assert not state.readable and state.needs_helper and "permission denied" in state.why, state
            assert str(home) in state.why
    finally:
        import shutil

        shutil.rmtree(home)


# --- the watcher ----------------------------------------------------------------------------


def test_a_count_only_source_reads_at_its_pace_and_loses_nothing(tmp_path: Path, make: Make) -> None:
    # two hundred writes a second: a source that gives no phase reports a count, at most
    # once per COUNT_PACE_S, and every line is in it; close() does not wait out a rest
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    began = time.monotonic()
    for _ in range(200):
        append(path, line("step_done"))
        time.sleep(0.005)  # the writer's pace, not a wait
    rec.wait_for(lambda s: s.count == 200)
    spent = time.monotonic() - began
    assert len(rec.states) <= spent / follow.COUNT_PACE_S + 2
    closing = time.monotonic()
    source.close()
    assert time.monotonic() - closing < follow.COUNT_PACE_S + 0.5


def test_checks_on_an_interval_without_inotify(tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise OSError(38, "inotify refused")

    monkeypatch.setattr(inotify_module, "Inotify", refuse)
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    written = time.monotonic()
    append(path, line("step_done"))
    rec.wait_for(lambda s: s.count == 1, timeout=2)
    assert time.monotonic() - written < 1.0


def test_a_failing_on_change_does_not_stop_the_watcher(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    calls: list[int] = []

    def explode(state: SourceState) -> None:
        calls.append(state.count)
        raise RuntimeError("observer bug")

    source.start(explode)
    append(path, line("step_done"))
    wait_until(lambda: len(calls) >= 1, 5, "the first call")
    append(path, line("step_done"))
    wait_until(lambda: len(calls) >= 2, 5, "a second call, after the first raised")
    assert calls == [1, 2]


def test_state_without_start_reads_the_file(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("step_done"))
    source = make(path=str(path), event="step_done")
    assert source.state().count == 0
    append(path, line("step_done"))
    assert source.state().count == 1


def test_close_stops_the_thread_and_frees_descriptors(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    fd_dir = "/proc/self/fd"

    def watching() -> set[str] | None:
        """What this process holds open on the file or for watching it (not a count: threads of
        other tests open and close their own descriptors meanwhile)."""
        if not os.path.isdir(fd_dir):
            return None
        held = set()
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if str(path) in target or "inotify" in target:
                held.add(f"{fd}:{target}")
        return held

    before = watching()
    threads_before = {t.name for t in threading.enumerate()}
    source = make(path=str(path), event="step_done")
    started(source)
    assert any(t.name.startswith("arbiter-jsonl:") for t in threading.enumerate()) or threads_before
    source.close()
    source.close()  # idempotent
    assert not any(t.name == f"arbiter-jsonl:{path}" for t in threading.enumerate())
    if before is not None:
        assert (watching() or set()) <= before
    with pytest.raises(PluginError, match="closed"):
        source.start(lambda s: None)


# --- real writers -------------------------------------------------------------------------

BURST_WRITER = r"""
import json, os, random, sys, time
path, total, rotate_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
n = 0
pending = b""
while n < total:
    burst = min(rng.randint(1, 400), total - n)
    data = pending + b"".join(json.dumps({"event": "step_done", "i": n + k}).encode() + b"\n" for k in range(burst))
    n += burst
    cut = rng.randint(0, len(data)) if n < total else len(data)  # a write may end mid-line
    os.write(fd, data[:cut])
    pending = data[cut:]
    if rotate_at and n >= rotate_at:
        os.write(fd, pending); pending = b""
        os.rename(path, path + ".1")  # rotation by rename; the writer then reopens
        os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        rotate_at = 0
    time.sleep(rng.random() * 0.003)
os.write(fd, pending)
os.close(fd)
"""


def test_ten_thousand_lines_in_bursts_across_a_rotation_none_lost_or_counted_twice(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    subprocess.run([sys.executable, "-c", BURST_WRITER, str(path), "10000", "5000"], check=True, timeout=60)
    rec.wait_for(lambda s: s.count >= 10000, timeout=10)
    # the writer is done: with the file now at the path read to its end, all is counted
    wait_until(lambda: caught_up(source, path), 10, "the source to read the new file to its end")
    assert source.state().count == 10000 and source.malformed == 0


def test_copy_truncate_under_a_writer_counts_what_follows_from_the_top(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="step_done")
    rec = started(source)
    writer = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for _ in range(50):
            os.write(writer, line("step_done").encode())
        rec.wait_for(lambda s: s.count == 50)
        with open(tmp_path / "events.jsonl.1", "wb") as copy:  # what logrotate's copytruncate does
            copy.write(path.read_bytes())
        os.truncate(path, 0)
        for _ in range(7):
            os.write(writer, line("step_done").encode())  # O_APPEND: written at the new end
        rec.wait_for(lambda s: s.count == 57)
        wait_until(lambda: caught_up(source, path), 5, "the source to read the file to its end")
        assert source.state().count == 57
    finally:
        os.close(writer)


def test_a_deleted_then_recreated_file_is_read_from_its_start(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("status", phase="uploading"))
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    rec = started(source)
    assert source.state().phase == "on"  # from the last phase line already there
    path.unlink()
    rec.wait_for(lambda s: not s.readable)
    append(path, line("status", phase="idle"), line("status", phase="uploading"), line("status", phase="idle"))
    state = rec.wait_for(lambda s: s.readable and s.count == 3)
    assert state.phase == "off"


def test_a_symlinked_file_is_heard_while_its_folder_is_busy_with_other_files(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no full check on an interval meanwhile: what is read was heard through a watch
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "target.jsonl"
    target.touch()
    link = tmp_path / "events.jsonl"
    link.symlink_to(target)
    source = make(path=str(link), event="status", field="phase", on=["uploading"])
    rec = started(source)
    stop = threading.Event()

    def busy() -> None:  # another program writing in the same folder all the time
        while not stop.is_set():
            append(real_dir / "other.log", "x\n")
            time.sleep(0.02)

    noise = threading.Thread(target=busy)
    noise.start()
    try:
        other = real_dir / "other.log"
        wait_until(lambda: other.exists() and other.stat().st_size >= 6, 10, "the folder busy")
        append(target, line("status", phase="uploading"))
        rec.wait_for(phase_is("on"), timeout=5)
    finally:
        stop.set()
        noise.join()


def idle_wakes(source: JsonlSource) -> list[int]:
    """The number of events of each wake of ``source``'s thread that concerned nothing it
    follows (the close of a write it just read may still wake it, rightly)."""
    wakes: list[int] = []
    sort_events = source._sort_events

    def counted(events: list[inotify_module.Event]) -> tuple[bool, bool]:
        relevant, rescan = sort_events(events)
        if not relevant:
            wakes.append(len(events))
        return relevant, rescan

    source._sort_events = counted  # type: ignore[method-assign]
    return wakes


@pytest.mark.parametrize("exists", [True, False], ids=["followed file", "missing file"])
def test_writes_to_other_files_in_the_folder_do_not_wake_the_watcher(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch, exists: bool
) -> None:
    # twenty sources in a folder beside a log written every 5 ms each woke 200 times a second
    # no full check on an interval meanwhile: what is read was heard through a watch
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    path = tmp_path / "events.jsonl"
    if exists:
        path.touch()
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    wakes = idle_wakes(source)
    rec = started(source)
    for _ in range(100):
        append(tmp_path / "other.log", "x\n")
        time.sleep(0.005)  # the other log's pace, not a wait
    assert len(wakes) <= 1, f"woken {len(wakes)} times by 100 writes to another file (the create may wake it once)"
    append(path, line("status", phase="uploading"))
    rec.wait_for(phase_is("on"), timeout=5)


def test_files_coming_and_going_beside_a_followed_file_do_not_wake_the_watcher(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a program replacing its status file four times a second beside thirteen quiet phase
    # files woke each of their watchers on every create and rename
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    monkeypatch.setattr(follow_fs, "fd_fs_type", lambda fd: "ext4")  # wherever tmp_path is
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    wakes = idle_wakes(source)
    rec = started(source)
    append(path, line("status", phase="idle"))  # what its start queued is read with this
    rec.wait_for(lambda s: s.count == 1, timeout=5)
    wakes.clear()
    for k in range(30):
        append(tmp_path / "status.tmp", f"{k}\n")
        os.replace(tmp_path / "status.tmp", tmp_path / "status.json")
        (tmp_path / f"other-{k}.log").touch()
        (tmp_path / f"other-{k}.log").unlink()
    assert not wakes, f"woken {len(wakes)} times by files created, renamed and deleted beside it"
    append(path, line("status", phase="uploading"))
    rec.wait_for(phase_is("on"), timeout=5)


def _folder_mask(source: JsonlSource, folder: Path) -> int | None:
    """The events the watch on ``folder`` asks for (the watcher's thread may be changing it)."""
    notes = source._notes
    try:
        wd = next(wd for wd, path in list(notes.watches.items()) if path == str(folder))
        return notes._masks.get(wd)
    except (StopIteration, RuntimeError):
        return None


@pytest.mark.parametrize(("fs_type", "quiet"), [("ext4", True), ("xfs", True), ("nfs4", False), ("fuse.sshfs", False)])
def test_a_followed_files_folder_is_fully_watched_on_a_network_filesystem(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch, fs_type: str, quiet: bool
) -> None:
    # a network filesystem's file watch may not hear the file leave its path: its folder's does
    monkeypatch.setattr(follow_fs, "fd_fs_type", lambda fd: fs_type)
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    rec = started(source)
    append(path, line("status", phase="idle"))
    rec.wait_for(lambda s: s.count == 1, timeout=5)
    wanted = inotify_module.IN_MOVE_SELF | inotify_module.IN_DELETE_SELF | inotify_module.IN_ONLYDIR
    if not quiet:  # files made, renamed and deleted beside it too (its writes are heard on it)
        wanted |= inotify_module.IN_CREATE | inotify_module.IN_MOVED_TO | inotify_module.IN_MOVED_FROM
        wanted |= inotify_module.IN_DELETE | inotify_module.IN_ATTRIB
    wait_until(lambda: _folder_mask(source, tmp_path) == wanted, 5, f"its folder's watch asking for {wanted:#x}")


def test_a_file_deleted_on_nfs_and_made_anew_is_followed_at_once(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NFS renames a file deleted while open to .nfsXXXX: its watch hears no change of its
    # links, and only its folder's watch hears that the path names another file
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    monkeypatch.setattr(follow_fs, "fd_fs_type", lambda fd: "nfs4")
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    sort_events = source._sort_events

    def as_on_nfs(events: list[inotify_module.Event]) -> tuple[bool, bool]:
        file_wd = source._notes.file_wd
        return sort_events([ev for ev in events if not (ev.wd == file_wd and ev.mask & inotify_module.IN_ATTRIB)])

    source._sort_events = as_on_nfs  # type: ignore[method-assign]
    rec = started(source)
    append(path, line("status", phase="idle"))
    rec.wait_for(lambda s: s.count == 1, timeout=5)
    path.unlink()
    append(path, line("status", phase="uploading"))
    rec.wait_for(phase_is("on"), timeout=5)


def test_a_file_replaced_again_and_again_is_followed_each_time(tmp_path: Path, make: Make) -> None:
    # once the followed file leaves the path, its folder is watched again for the next one
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    rec = started(source)
    for k, phase in enumerate(["uploading", "idle", "uploading", "idle"]):
        os.chmod(path, 0o640)  # its attributes changed, still the file at the path
        append(path, line("status", phase="idle" if phase == "uploading" else "uploading"))
        replacement = tmp_path / f"events-{k}.tmp"
        append(replacement, line("status", phase=phase))
        os.replace(replacement, path)
        rec.wait_for(phase_is("on" if phase == "uploading" else "off"), timeout=5)
    path.unlink()
    rec.wait_for(lambda s: not s.readable, timeout=5)
    append(path, line("status", phase="uploading"))
    rec.wait_for(lambda s: s.readable and s.phase == "on", timeout=5)


def test_a_file_whose_folder_is_renamed_and_made_anew_is_followed_in_the_new_folder(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the followed file keeps its name and links when its folder moves: only a watch on the
    # folder hears that the path may name another file now
    monkeypatch.setattr(follow, "SAFETY_INTERVAL_S", 3600.0)
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["uploading"])
    rec = started(source)
    append(path, line("status", phase="idle"))
    rec.wait_for(lambda s: s.count == 1, timeout=5)
    folder.rename(tmp_path / "logs.old")
    folder.mkdir()
    append(path, line("status", phase="uploading"))
    rec.wait_for(phase_is("on"), timeout=5)


def test_a_file_renamed_away_with_nothing_in_its_place_goes_unreadable(
    tmp_path: Path, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arbiter_sources import follow

    monkeypatch.setattr(follow, "ROTATION_GRACE_S", 3600.0)
    path = tmp_path / "events.jsonl"
    append(path, line("step_done"))
    source = make(path=str(path), event="step_done")
    rec = started(source)
    os.rename(path, tmp_path / "events.jsonl.1")

    def seen_gone() -> bool:
        with source._lock:  # what it made of it is published
            return source._gone_since is not None

    wait_until(seen_gone, 5, "the source to see the path empty")
    assert source.state().readable  # a rotation in progress, within its grace
    monkeypatch.setattr(follow, "ROTATION_GRACE_S", 0.5)  # and once that is over
    assert "renamed" in rec.wait_for(lambda s: not s.readable, timeout=5).why


def test_a_file_made_terabytes_of_holes_is_unreadable_not_read_without_end(tmp_path: Path, make: Make) -> None:
    """The file's owner truncates it up to a terabyte of holes: the source reads at most one
    pass of zeros, then says the file is unreadable (a core read zeros without end before);
    closing it ends its thread at once, and a file truncated back is read again."""
    path = tmp_path / "events.jsonl"
    append(path, line("status", phase="render"))
    source = make(path=str(path), event="status", field="phase", on=["render"])
    rec = started(source)
    assert source.state().phase == "on"
    os.truncate(path, 1 << 40)
    state = rec.wait_for(lambda s: not s.readable, timeout=30)
    assert "grew by" in state.why and "sparse or runaway" in state.why, state
    os.truncate(path, 0)
    append(path, line("status", phase="idle"))
    rec.wait_for(lambda s: s.readable and s.phase == "off", timeout=30)
    os.truncate(path, 4 << 40)
    rec.wait_for(lambda s: not s.readable, timeout=30)
    thread = source._thread
    began = time.monotonic()
    source.close()
    assert thread is not None and not thread.is_alive() and time.monotonic() - began < 5


def test_a_terabyte_of_holes_at_the_first_open_is_not_read_back(tmp_path: Path, make: Make) -> None:
    path = tmp_path / "events.jsonl"
    append(path, line("status", phase="render"))
    os.truncate(path, 1 << 40)
    source = make(path=str(path), event="status", field="phase", on=["render"])
    began = time.monotonic()
    rec = started(source)
    assert time.monotonic() - began < 5
    # the holes and what is appended to them make one line far too long: its end is dropped
    # with it (a line's tail is never read as a line), and the next line counts
    append(path, line("status", phase="off"))
    append(path, line("status", phase="render"))
    rec.wait_for(phase_is("on"), timeout=30)
    assert source.malformed == 1


def test_told_it_is_watched_elsewhere_while_it_reads_it_answers_at_once(tmp_path: Path, make: Make) -> None:
    """The daemon gives the call up after a second: one waiting for a long read to end would
    leave the file resting with nobody reading it."""
    path = tmp_path / "events.jsonl"
    path.touch()
    source = make(path=str(path), event="status", field="phase", on=["on"])
    started(source)
    with source._lock:  # a read in progress
        told = threading.Thread(target=source.watched_elsewhere, args=(True,))
        told.start()
        told.join(timeout=5)
        assert not told.is_alive()
    source.watched_elsewhere(False)
