"""Matching programs as people really launch them: `cd ComfyUI && python main.py` (by working
directory and by script), `python -m vllm.entrypoints.openai.api_server` (by module), and by
executable, each a real process read from the real process table."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arbiter.plugin import ProcessInfo
from arbiter_matchers import ProcessMatcher, process_table
from arbiter_testing.waiting import wait_until

SLEEPER = "import time\ntime.sleep(60)\n"


def matcher(**block: Any) -> ProcessMatcher:
    return ProcessMatcher(ProcessMatcher.Options.model_validate(block))


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    (comfy / "main.py").write_text(SLEEPER)
    pkg = tmp_path / "site" / "fakevllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for folder in (pkg, pkg.parent, pkg.parent.parent):
        (folder / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(SLEEPER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    procs = {
        # the shell's `cd ComfyUI && python main.py`: a relative script in its working directory
        "comfy": subprocess.Popen([sys.executable, "main.py", "--listen"], cwd=comfy),
        "vllm": subprocess.Popen([sys.executable, "-m", "fakevllm.entrypoints.openai.api_server"], env=env),
        "by_path": subprocess.Popen([sys.executable, str(comfy / "main.py")], cwd=tmp_path),
    }
    try:
        yield procs
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)


def table_with(pids: set[int]) -> list[ProcessInfo]:
    def ready() -> list[ProcessInfo] | None:
        table = process_table()
        ours = [p for p in table if p.pid in pids]
        # the interpreter has exec'd and its arguments are in place
        return table if len(ours) == len(pids) and all(len(p.cmdline) > 1 for p in ours) else None

    return wait_until(ready, 15, "the launched processes in the process table")


def test_each_launch_form_is_matched(launched: dict[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    comfy, vllm, by_path = (launched[k].pid for k in ("comfy", "vllm", "by_path"))
    table = table_with({comfy, vllm, by_path})
    mine = {comfy, vllm, by_path}

    def picked(**block: Any) -> set[int]:
        return matcher(**block).select(table) & mine

    # by working directory: a folder name anywhere in it, or a path prefix
    assert picked(cwd=["comfyui"]) == {comfy}
    assert picked(cwd=[str(tmp_path)]) == {comfy, by_path}
    # by script: relative as launched, or by its path's tail
    assert picked(script=["main.py"]) == {comfy, by_path}
    # relative to its working directory: `cd ComfyUI && python main.py` runs ComfyUI/main.py
    assert picked(script=["ComfyUI/main.py"]) == {comfy, by_path}
    assert picked(script=["comfyui/MAIN.py"]) == {comfy, by_path}
    assert picked(script=["other/main.py"]) == set()
    assert picked(script=["main.py"], cwd=["ComfyUI"]) == {comfy}
    # by module, exactly or by a package above it
    assert picked(module=["fakevllm.entrypoints.openai.api_server"]) == {vllm}
    assert picked(module=["fakevllm"]) == {vllm}
    assert picked(module=["fakevll"]) == set()
    # by executable
    exe = os.path.realpath(sys.executable)
    assert picked(path_prefix=[os.path.dirname(exe)], module=["fakevllm"]) == {vllm}


def test_forms_on_a_table() -> None:
    table = [
        ProcessInfo(10, 1, name="python3", cmdline=("python3", "-mvllm.entrypoints.openai.api_server")),
        ProcessInfo(11, 1, name="python3", cmdline=("python3", "-m", "pip", "install", "vllm")),
        ProcessInfo(12, 1, name="vllm", cmdline=("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "Qwen")),
        ProcessInfo(13, 1, name="python", cmdline=("python", "notmain.py")),
    ]
    assert matcher(module=["vllm"]).select(table) == {10}
    assert matcher(script=["bin/vllm"]).select(table) == {12}
    assert matcher(script=["main.py"]).select(table) == set()
    windows = [ProcessInfo(20, 1, name="python.exe", cmdline=("python_embeded\\python.exe", "-s", "ComfyUI\\main.py"))]
    assert matcher(script=["ComfyUI/main.py"]).select(windows) == {20}
    assert matcher(cwd=["ComfyUI"]).select(table) == set()  # these pids are not real: no cwd, no match


def test_the_new_selectors_are_selectors_and_checked() -> None:
    assert ProcessMatcher.Options.model_validate({"cwd": "ComfyUI"}).cwd == ["ComfyUI"]
    with pytest.raises(ValidationError, match="must not be empty"):
        ProcessMatcher.Options.model_validate({"module": [""]})


def test_the_shipped_comfyui_match_takes_both_launches(launched: dict[str, subprocess.Popen[bytes]]) -> None:
    import yaml

    root = Path(__file__).resolve().parents[3]
    block = yaml.safe_load((root / "tenants.d" / "diffusion-server.yaml").read_text())["match"]
    comfy, by_path, vllm = (launched[k].pid for k in ("comfy", "by_path", "vllm"))
    table = table_with({comfy, by_path, vllm})
    assert matcher(**{**block, "tree": "process"}).select(table) & {comfy, by_path, vllm} == {comfy, by_path}
