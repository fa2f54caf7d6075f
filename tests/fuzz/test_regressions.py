"""Bugs the fuzzing found, each pinned by the smallest input that showed it."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from arbiter.config.errors import ConfigError
from arbiter.config.loader import load_node_config, parse_rule, read_text
from arbiter.config.yamlpos import MAX_VALUES, load_with_positions
from arbiter.daemon.api import NodeApi
from arbiter.plugin import PluginContext
from arbiter.pluginmanager import build_plugin_manager
from arbiter.sdk.control import Control, read_control_document, write_control_document
from arbiter_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load_kit() -> ModuleType:
    return load_script(ROOT / "tests" / "fuzz" / "kit.py", "arbiter_fuzz_kit")


def only_problem(text: str) -> tuple[int, int, str]:
    with pytest.raises(ConfigError) as err:
        load_with_positions(text, "f.yaml")
    (p,) = err.value.problems
    assert p.file == "f.yaml"
    return p.line, p.column, p.message


# --- YAML ------------------------------------------------------------------------------------


def test_deep_nesting_is_a_problem_at_a_line_not_a_recursion_error() -> None:
    line, _col, message = only_problem("id: x\nmatch: " + "[" * 3000 + "]" * 3000 + "\n")
    assert line == 2 and "nested too deeply" in message


def test_a_control_character_is_placed_at_its_line_and_column() -> None:
    assert only_problem("id: x\nnotes: a\x07b\n")[:2] == (2, 9)
    assert "#x0007" in only_problem("id: x\nnotes: a\x07b\n")[2]


@pytest.mark.parametrize("value", ["9" * 5000, "2024-13-45"])
def test_a_value_python_cannot_build_is_a_problem_at_its_line(value: str) -> None:
    line, col, message = only_problem(f"id: x\npriority: {value}\n")
    assert (line, col) == (2, 11) and message.startswith("cannot read this value")


def test_aliases_that_expand_without_end_are_refused() -> None:
    levels = ["a: &a [x,x,x,x,x,x,x,x,x,x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 10)}]" for i in range(8)
    ]
    assert f"more than {MAX_VALUES} values" in only_problem("\n".join(levels) + "\n")[2]
    data, _ = load_with_positions("a: &a [1, 2]\nb: *a\n", "f.yaml")  # an ordinary alias still reads
    assert data == {"a": [1, 2], "b": [1, 2]}


def test_a_key_written_twice_is_a_problem_at_the_second() -> None:
    line, col, message = only_problem("id: x\npriority: 10\nmatch: {name: [a]}\npriority: 20\n")
    assert (line, col) == (4, 1) and "'priority' is written twice" in message
    data, _ = load_with_positions("base: &b {x: 1, y: 2}\nthing:\n  <<: *b\n  x: 3\n", "f.yaml")
    assert data["thing"] == {"x": 3, "y": 2}  # a merge key's values may be overridden


def test_bytes_that_are_not_utf8_are_placed(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"id: x\nnotes: caf\xe9\n")
    with pytest.raises(ConfigError) as err:
        read_text(path)
    (p,) = err.value.problems
    assert (p.line, p.column) == (2, 11) and "0xe9" in p.message


def test_a_tilde_naming_no_user_is_a_config_problem(tmp_path: Path) -> None:
    path = tmp_path / "arbiter.yaml"
    path.write_text("tenants_dirs: [/etc/arbiter/tenants.d, ~nosuchuser9/tenants.d]\n")
    with pytest.raises(ConfigError) as err:
        load_node_config(path)
    (p,) = err.value.problems
    assert p.file == str(path) and p.field == "tenants_dirs.1" and "names no user" in p.message


@pytest.mark.parametrize("regex", ["a{99999999999}", "(" * 2000 + ")" * 2000])
def test_a_log_regex_too_large_to_compile_is_a_problem(regex: str) -> None:
    host = build_plugin_manager()
    text = f"id: x\nmatch: {{name: [a]}}\nprotect:\n  source: {{kind: log, path: /tmp/x.log, log_regex: '{regex}'}}\n"
    with pytest.raises(ConfigError) as err:
        parse_rule(text, "t.yaml", host.options_model, host.kind_names)
    (p,) = err.value.problems
    assert p.field == "protect.source.log_regex" and p.line == 4 and "too large" in p.message


# --- what jobs and the daemon read ---------------------------------------------------------------


def test_a_jsonl_line_nested_thousands_deep_is_skipped_as_malformed(tmp_path: Path) -> None:
    from arbiter_sources import JsonlSource

    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    source = JsonlSource(
        JsonlSource.Options.model_validate({"kind": "jsonl", "path": str(path), "event": "step_done"}),
        PluginContext(state_dir=tmp_path),
    )
    try:
        source.state()
        with open(path, "ab") as fh:
            fh.write(b"[" * 100_000 + b"\n" + json.dumps({"event": "step_done"}).encode() + b"\n")
        state = source.state()
        assert state.readable and state.count == 1 and source.malformed == 1
    finally:
        source.close()


@pytest.mark.parametrize(
    "doc",
    [
        {"v": 1, "seq": "9", "state": "stop", "gpu_duty": 0.0},
        {"v": 1, "seq": [9], "state": "stop", "gpu_duty": 0.0},
        {"v": 1, "seq": 9, "state": "stop", "gpu_duty": "none"},
        {"v": 1, "seq": 9, "state": "run", "gpu_duty": 7.5},
        {"v": 1, "seq": 9, "state": "run", "gpu_duty": math.nan},
        {"v": 1, "seq": True, "state": "stop", "gpu_duty": 0.0},
        {"v": 1, "seq": 9, "state": "stop", "gpu_duty": 0.0, "reason": {"why": 1}},
    ],
)
def test_a_control_document_of_the_wrong_shape_is_ignored_not_raised(tmp_path: Path, doc: dict[str, object]) -> None:
    path = str(tmp_path / "control.json")
    write_control_document(path, "paused", 0.25, 3, "held")
    ctl = Control(path=path, install_handler=False)
    Path(path).write_text(json.dumps(doc))
    assert read_control_document(path) is None
    assert ctl.refresh() is False and (ctl.state, ctl.seq, ctl.gpu_duty) == ("paused", 3, 0.25)


def test_a_whole_number_written_as_a_float_is_a_seq(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    path.write_text('{"v": 1, "seq": 4e3, "state": "paused", "gpu_duty": 0}')
    ctl = Control(path=str(path), install_handler=False)
    assert (ctl.state, ctl.seq, ctl.gpu_duty) == ("paused", 4000, 0.0)


# --- the daemon's socket ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"limit": math.inf}, "'limit'"),
        ({"limit": "ten"}, "'limit'"),
        ({"limit": 2.5}, "'limit'"),
        ({"code": ["JOB_PAUSED"]}, "'code'"),
        ({"subject": {"a": 1}}, "'subject'"),
    ],
)
def test_timeline_arguments_are_checked_by_name(args: dict[str, object], named: str) -> None:
    answer = NodeApi(None).dispatch("timeline", args, (os.getpid(), os.getuid()))  # type: ignore[arg-type]  # refused before it is used
    assert answer["ok"] is False and answer["code"] == "BAD_REQUEST"
    assert answer["error"].startswith("timeline: argument ") and named in answer["error"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    harness = _load_kit().Harness(tmp_path_factory.mktemp("daemon"))
    harness.daemon()
    yield harness
    harness.close()


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        ({"op": "job.wait", "id": "{live}", "timeout": math.nan}, "'timeout'"),
        ({"op": "job.wait", "id": "{live}", "timeout": "soon"}, "'timeout'"),
        ({"op": "job.started", "id": "{live}"}, "'pid' is missing"),
        ({"op": "job.started", "id": "{live}", "pid": 1e300}, "'pid'"),
        ({"op": "job.exited", "id": "{live}", "exit_code": math.inf}, "'exit_code'"),
        ({"op": "job.exited", "id": "{live}", "exit_code": 2**70}, "'exit_code'"),
    ],
)
def test_job_arguments_are_checked_by_name(live: object, request_: dict[str, object], named: str) -> None:
    line = json.dumps({**request_, "id": live._live_job}).encode() + b"\n"  # type: ignore[attr-defined]
    answer = live._ask(line)  # type: ignore[attr-defined]
    assert answer["ok"] is False and answer["code"] == "BAD_REQUEST", answer
    assert answer["error"].startswith(f"{request_['op']}: argument ") and named in answer["error"]


@pytest.mark.parametrize("line", [b"null\n", b"[" * 100_000 + b"\n"])
def test_the_socket_answers_every_line(live: object, line: bytes) -> None:
    answer = live._ask(line)  # type: ignore[attr-defined]
    assert answer is not None and answer["ok"] is False and answer["code"] == "BAD_REQUEST"
    assert live._ask(b'{"op": "ping"}\n')["ok"] is True  # type: ignore[attr-defined]
