"""One table of operations: each has one method that declares who may call it, and everything
that asks the daemon asks by the table's names.  One catalogue of codes: every code written
anywhere is in it."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from arbiter.api.ops import Op, Who
from arbiter.daemon.api import NodeApi
from arbiter.daemon.operation import declared
from arbiter.engine import codes
from arbiter.http.provider import Provider

ROOT = Path(__file__).resolve().parents[1]
#: NodeApi's members that are not operations: the socket's entry, the rights check, the
#: token the HTTP listener asks for, and the picture of a report only HTTP serves
NOT_OPERATIONS = {"dispatch", "call", "is_admin", "token", "ab_plot"}


def test_every_operation_has_one_method_that_declares_its_rights() -> None:
    table = declared(NodeApi)
    assert set(table) == set(Op), f"without a method: {set(Op) - set(table)}"
    for op, entry in table.items():
        assert entry.method.__name__ == op.method, f"{op} is carried out by {entry.method.__name__}"
        assert isinstance(entry.declared.who, Who)
    public = {name for name, _ in inspect.getmembers(NodeApi) if not name.startswith("_")}
    undeclared = public - {op.method for op in Op} - NOT_OPERATIONS
    assert not undeclared, f"public members of NodeApi that declare no operation: {undeclared}"


def test_a_method_without_a_declaration_is_no_operation() -> None:
    class Extra(NodeApi):
        def job_stop(self) -> dict[str, object]:  # type: ignore[override]  # overrides without declaring
            return {}

    assert Op.JOB_STOP not in declared(Extra), "an undeclared method must not be reachable"


def test_the_http_provider_is_the_tables_read_side() -> None:
    names = {n for n, _ in inspect.getmembers(Provider) if not n.startswith("_")}
    assert names <= {op.method for op in Op} | NOT_OPERATIONS
    for name in names - NOT_OPERATIONS:
        assert declared(NodeApi)[Op(next(o for o in Op if o.method == name))].declared.who in (Who.ANYONE, Who.ADMIN)


def test_the_command_line_asks_by_the_tables_names() -> None:
    """No request is named by a bare string: a misspelt one would fail only when run."""
    pattern = re.compile(r"""(\bask\(\s*config,\s*|\bClient\([^)]*\)\.call\(\s*|\bclient\.call\(\s*)["']""")
    offenders = []
    for path in sorted((ROOT / "arbiter").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _codes_written(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "codes":
                names.add(node.attr)
    return names


def test_every_code_written_is_in_the_catalogue() -> None:
    catalogue = codes.catalogue()
    constants = {n for n, v in vars(codes).items() if n.isupper() and isinstance(v, str)}
    assert constants == set(catalogue), constants ^ set(catalogue)
    assert len(catalogue) == len(codes.CATALOGUE), "a code is listed twice"
    sources = [p for p in (ROOT / "arbiter").rglob("*.py")] + list((ROOT / "plugins").glob("*/src/**/*.py"))
    written = _codes_written(sources) - {"CATALOGUE", "Code", "catalogue", "Kind"}
    assert written <= set(catalogue), f"codes written but not in the catalogue: {written - set(catalogue)}"


def test_every_reason_the_engine_gives_is_a_hold_or_a_problem() -> None:
    catalogue = codes.catalogue()
    for path in sorted((ROOT / "arbiter" / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Reason" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Attribute) and getattr(first.value, "id", "") == "codes":
                    assert catalogue[first.attr].kind in ("hold", "problem"), f"{path.name}: {first.attr}"
