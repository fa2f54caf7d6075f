"""The ``process`` matcher: rule fields, their combinations and real process trees."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from arbiter.plugin import ProcessInfo
from arbiter_matchers import ProcessMatcher, arbiter_register_matchers, process_table
from arbiter_testing.waiting import wait_until


def matcher(**block: object) -> ProcessMatcher:
    return ProcessMatcher(ProcessMatcher.Options.model_validate(block))


def proc(pid: int, ppid: int = 1, **fields: object) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, **fields)  # type: ignore[arg-type]


TABLE = [
    proc(1, 0, name="init", exe="/sbin/init", cmdline=("/sbin/init",), uid=0, username="root"),
    proc(
        100,
        1,
        name="Ollama",
        exe="/usr/local/bin/ollama",
        cmdline=("/usr/local/bin/ollama", "serve"),
        uid=1000,
        username="alice",
    ),
    proc(
        101,
        100,
        name="ollama_llama_server",
        exe="/usr/local/lib/ollama/runner",
        cmdline=("/usr/local/lib/ollama/runner", "--model", "/models/Llama-3.gguf"),
        uid=1000,
        username="alice",
    ),
    proc(102, 101, name="helper", exe="/usr/bin/helper", cmdline=("helper",), uid=1000, username="alice"),
    proc(
        200,
        1,
        name="python3",
        exe="/usr/bin/python3.11",
        cmdline=("python3", "-m", "ComfyUI.main", "--listen"),
        uid=1001,
        username="bob",
    ),
    proc(
        300,
        1,
        name="python3",
        exe="/opt/trainer/bin/python3",
        cmdline=("/opt/trainer/bin/python3", "train.py", "--config", "Big.YAML"),
        uid=1000,
        username="alice",
    ),
]


def test_registers_process_kind() -> None:
    seen: dict[str, type] = {}
    arbiter_register_matchers(lambda name, cls: seen.__setitem__(name, cls))
    assert seen == {"process": ProcessMatcher}


def test_name_is_exact_and_case_insensitive() -> None:
    assert matcher(name=["ollama"]).select(TABLE) == {100}
    assert matcher(name=["OLLAMA"]).select(TABLE) == {100}
    assert matcher(name=["olla"]).select(TABLE) == set()


def test_a_single_string_is_a_one_entry_list() -> None:
    assert matcher(kind="process", name="ollama").select(TABLE) == {100}


def test_cmdline_substring_is_case_insensitive_over_the_joined_line() -> None:
    assert matcher(cmdline=["comfyui.MAIN"]).select(TABLE) == {200}
    # The joined line has spaces between arguments, so a substring may span two of them.
    assert matcher(cmdline=["ollama serve"]).select(TABLE) == {100}


def test_cmdline_endswith() -> None:
    assert matcher(cmdline_endswith=["big.yaml"]).select(TABLE) == {300}
    assert matcher(cmdline_endswith=["train.py"]).select(TABLE) == set()


def test_or_within_a_field_and_across_fields() -> None:
    assert matcher(name=["ollama", "helper"]).select(TABLE) == {100, 102}
    assert matcher(name=["python3"]).select(TABLE) == {200, 300}
    assert matcher(name=["python3"], cmdline=["train.py"]).select(TABLE) == {300}
    assert matcher(name=["python3"], cmdline=["train.py"], user=["bob"]).select(TABLE) == set()


def test_path_prefix_and_home_expansion() -> None:
    assert matcher(path_prefix=["/usr/local/"]).select(TABLE) == {100, 101}
    home = os.path.expanduser("~")
    table = [proc(400, 1, name="x", exe=f"{home}/apps/tool/bin/x", cmdline=("x",))]
    assert matcher(path_prefix=["~/apps/tool/"]).select(table) == {400}


def test_path_prefix_falls_back_to_an_absolute_argv0_when_the_executable_is_unreadable() -> None:
    table = [
        proc(500, 1, name="trainer", exe="", cmdline=("/opt/trainer/bin/python3", "train.py")),
        proc(501, 1, name="trainer", exe="", cmdline=("python3", "train.py")),
    ]
    assert matcher(path_prefix=["/opt/trainer/"]).select(table) == {500}


def test_user_by_name_or_uid() -> None:
    assert matcher(name=["python3"], user=["bob"]).select(TABLE) == {200}
    assert matcher(name=["python3"], user=["1000"]).select(TABLE) == {300}
    assert matcher(name=["python3"], user=[1001]).select(TABLE) == {200}


def test_user_name_known_to_the_host_matches_a_process_whose_name_was_unreadable() -> None:
    table = [proc(600, 1, name="x", cmdline=("x",), uid=0, username="")]
    assert matcher(name=["x"], user=["root"]).select(table) == {600}


def test_descendants_follow_the_whole_tree() -> None:
    assert matcher(name=["ollama"], tree="descendants").select(TABLE) == {100, 101, 102}
    assert matcher(name=["ollama"], tree="process").select(TABLE) == {100}


def test_never_selects_the_calling_process() -> None:
    me = os.getpid()
    table = [proc(me, 1, name="arbiter", cmdline=("arbiter", "run"))]
    assert matcher(name=["arbiter"]).select(table) == set()
    parent_table = [proc(7, 1, name="shell", cmdline=("shell",)), proc(me, 7, name="arbiter")]
    assert matcher(name=["shell"], tree="descendants").select(parent_table) == {7}


def test_select_is_pure_over_its_input() -> None:
    m = matcher(name=["ollama"], tree="descendants")
    assert m.select([]) == set()
    assert m.select(TABLE) == m.select(list(TABLE)) == {100, 101, 102}


def test_a_process_unchanged_since_it_was_judged_is_not_judged_again_even_after_offers_of_only_a_few(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = matcher(name="python3")
    judged: list[int] = []
    real = m._matches

    def judging(p: ProcessInfo) -> bool:
        judged.append(p.pid)
        return real(p)

    monkeypatch.setattr(m, "_matches", judging)
    assert m.select(TABLE) == {200, 300}
    assert m.select(TABLE[4:5]) == {200}  # the daemon offers only what changed: nothing of the rest is forgotten
    assert m.select(TABLE) == {200, 300}
    assert judged == [p.pid for p in TABLE]  # each once
    for k in range(4):  # tables of processes that each replaced the last: the memory stays bounded
        wide = [proc(10**7 * (k + 1) + i, name="python3") for i in range(200)]  # no real pid
        assert len(m.select(wide)) == 200
        assert m.select(wide[:3]) == {p.pid for p in wide[:3]}
    assert set(m._judged) == {p.pid for p in wide}  # a wide offer forgot the pids that are gone


@pytest.mark.parametrize("block", [{}, {"kind": "process"}, {"user": ["alice"]}, {"tree": "descendants"}])
def test_a_block_without_a_selector_is_refused(block: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as err:
        ProcessMatcher.Options.model_validate(block)
    message = str(err.value)
    for field in ("name", "cmdline", "cmdline_endswith", "path_prefix"):
        assert field in message


def test_unknown_fields_empty_entries_and_other_kinds_are_refused() -> None:
    with pytest.raises(ValidationError):
        ProcessMatcher.Options.model_validate({"name": ["x"], "nmae": ["y"]})
    with pytest.raises(ValidationError, match="empty"):
        ProcessMatcher.Options.model_validate({"cmdline": [""]})
    with pytest.raises(ValidationError):
        ProcessMatcher.Options.model_validate({"kind": "other", "name": ["x"]})
    with pytest.raises(ValidationError):
        ProcessMatcher.Options.model_validate({"name": ["x"], "tree": "children"})


# --- a real process tree -------------------------------------------------------------------

_TREE_SCRIPT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1] + "-leaf"])
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def process_tree() -> Iterator[tuple[str, int, int]]:
    marker = f"arbiter-test-{uuid.uuid4().hex}"
    root = subprocess.Popen([sys.executable, "-c", _TREE_SCRIPT, marker], stdout=subprocess.PIPE, text=True)
    assert root.stdout is not None
    leaf = int(root.stdout.readline())
    try:
        yield marker, root.pid, leaf
    finally:
        for pid in (leaf, root.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        root.wait(timeout=10)


def test_descendants_of_a_real_tree(process_tree: tuple[str, int, int]) -> None:
    marker, root, leaf = process_tree
    # The leaf's own command line carries the marker too; cmdline_endswith picks the root only.
    only_root = {"cmdline_endswith": [marker.upper()]}

    def with_the_tree() -> list[ProcessInfo] | None:
        # the leaf counts once it runs its own command (forked, it still shows its parent's)
        table = process_table()
        seen = {p.pid: p.cmdline for p in table}
        return table if root in seen and seen.get(leaf, ("",))[-1:] == (marker + "-leaf",) else None

    table = wait_until(with_the_tree, 10, "the tree in the process table")
    assert matcher(**only_root).select(table) == {root}
    assert matcher(**only_root, tree="descendants").select(table) == {root, leaf}
    assert matcher(cmdline=[marker], tree="process").select(table) == {root, leaf}
    assert matcher(cmdline=[marker], user=[str(os.getuid())]).select(table) == {root, leaf}
    assert matcher(cmdline=[marker], user=[str(os.getuid() + 1)]).select(table) == set()
