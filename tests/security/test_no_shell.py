"""Nothing in the repository hands a string to a shell: no ``shell=True`` (or any truthy
``shell=``), no ``os.system``/``os.popen``/``subprocess.getoutput``.  Unlike the text check in
tests/test_house_rules.py this reads the syntax tree, so ``shell = True`` spelled with
spaces or ``shell=1`` is caught too, and it covers examples/, bench/ and tests/ as well."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("arbiter", "plugins", "examples", "bench", "tests", "docs")
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput")}


def python_files() -> list[Path]:
    files = [p for tree in TREES for p in (ROOT / tree).rglob("*.py")]
    return [p for p in files if ".venv" not in p.parts and "node_modules" not in p.parts]


def shell_uses(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and not kw.value.value):
                found.append((node.lineno, "shell=" + ast.unparse(kw.value)))
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and (func.value.id, func.attr) in SHELL_CALLS
        ):
            found.append((node.lineno, f"{func.value.id}.{func.attr}()"))
    return found


def test_the_check_catches_each_form() -> None:
    bad = (
        "import os, subprocess\nsubprocess.run('x', shell = True)\nsubprocess.run('x', shell=1)\nos.system('x')\n"
        "os.popen('x')\nsubprocess.getoutput('x')\nsubprocess.Popen(['x'], shell=flag)\n"
    )
    assert [what for _, what in shell_uses(bad)] == [
        "shell=True",
        "shell=1",
        "os.system()",
        "os.popen()",
        "subprocess.getoutput()",
        "shell=flag",
    ]
    assert shell_uses("import subprocess\nsubprocess.run(['x'], shell=False)\n") == []


def test_no_shell_anywhere_in_the_repository() -> None:
    files = python_files()
    assert len(files) > 100, "the walk found too few files to mean anything"
    hits = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files for line, what in shell_uses(p.read_text())]
    assert not hits, "run argv lists, never a shell:\n" + "\n".join(hits)
