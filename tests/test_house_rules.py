"""The core stays generic, pure where it must be, and light where it must start fast."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from arbiter import hookspecs

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "arbiter"
# programs, vendors and OS mechanisms that belong in plugins or rule files, never in the core
FORBIDDEN = re.compile(
    r"ollama|comfy|llama|nvidia|nvml|pynvml|amdgpu|vulkan|opencl|\bmetal\b|directml|sigstop|sigcont|"
    r"cgroup|/proc/|\bdrm\b|fdinfo|ioreg|psutil|inotify|kqueue",
    re.IGNORECASE,
)


def core_files(exclude_sdk: bool = True) -> list[Path]:
    files = sorted(CORE.rglob("*.py"))
    return [f for f in files if not (exclude_sdk and "sdk" in f.relative_to(CORE).parts)]


def test_core_names_no_program_vendor_or_os_mechanism() -> None:
    hits = []
    for path in core_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "move these to a plugin or a rule file:\n" + "\n".join(hits)


def test_the_name_check_would_catch_one() -> None:
    assert FORBIDDEN.search("reader = pynvml.nvmlInit()")
    assert FORBIDDEN.search("os.kill(pid, signal.SIGSTOP)")
    assert not FORBIDDEN.search("signal translator pauses a tree")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_engine_is_pure() -> None:
    allowed = {"__future__", "dataclasses", "typing", "collections", "math", "enum", "arbiter", "statistics"}
    for path in (CORE / "engine").rglob("*.py"):
        found = _imports(path) - allowed
        assert not found, f"{path.name} imports {found}: the engine does no I/O and reads no clock"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("arbiter."):
                assert node.module.startswith("arbiter.engine"), f"{path.name} imports {node.module}"


def test_sdk_uses_only_the_standard_library_and_itself() -> None:
    # its own modules by relative imports only, so a job can vendor the folder under any name
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for path in (CORE / "sdk").rglob("*.py"):
        assert _imports(path) <= stdlib, f"{path.name} imports {_imports(path) - stdlib}"


def test_child_work_uses_only_the_standard_library() -> None:
    # a plugin's child runs it with ``python -I -S``: nothing else is importable there
    # (its parent side starts the child through arbiter.runtime.children, itself of the standard
    # library alone, imported in the parent only)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert _imports(CORE / "runtime" / "childwork.py") - {"arbiter"} <= stdlib, (
        _imports(CORE / "runtime" / "childwork.py") - stdlib
    )
    from_arbiter = {
        node.module
        for node in ast.walk(ast.parse((CORE / "runtime" / "childwork.py").read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("arbiter")
    }
    assert from_arbiter <= {"arbiter.runtime.children"}, from_arbiter
    assert _imports(CORE / "runtime" / "children.py") <= stdlib, _imports(CORE / "runtime" / "children.py") - stdlib


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    import json

    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_core_imports_no_plugin_dependency() -> None:
    modules = [
        "arbiter." + ".".join(p.relative_to(CORE).with_suffix("").parts)
        for p in core_files(exclude_sdk=False)
        if p.name not in ("__main__.py",)
    ]
    loaded = _modules_after("\n".join(f"import {m.removesuffix('.__init__')}" for m in modules))
    for dep in ("psutil", "pynvml", "websockets"):
        assert dep not in loaded, f"the core imported {dep}"
    assert not any(m.startswith("arbiter_") for m in loaded), "the core imported a plugin"


def test_cli_imports_neither_http_server_nor_plugins() -> None:
    loaded = _modules_after("import arbiter.cli.main")
    assert not {"fastapi", "uvicorn", "starlette", "psutil"} & loaded
    assert not any(m.startswith("arbiter_") or m.startswith("arbiter.http") for m in loaded)


def test_every_hook_is_documented_with_its_parameters() -> None:
    docs = (ROOT / "docs" / "hooks.md").read_text()
    hooks = [(n, f) for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("arbiter_")]
    assert len(hooks) >= 8
    for name, fn in hooks:
        assert f"`{name}(" in docs, f"{name} is missing from docs/hooks.md"
        doc = inspect.getdoc(fn) or ""
        assert doc, f"{name} has no docstring"
        for param in inspect.signature(fn).parameters:
            assert f":param {param}:" in doc, f"{name} does not document {param}"
        if getattr(fn, "arbiter_spec", {}).get("firstresult"):
            assert "firstresult" in doc, f"{name} is firstresult but does not say so"


def test_no_shell_true_anywhere() -> None:
    for path in [*CORE.rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        assert "shell=True" not in path.read_text(), path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the core → the core modules it imports anywhere in it: at the top, in
    a function, or only for the type checker (a cycle there is a cycle in the design)."""
    modules = {_module_name(p): p for p in CORE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_in_the_core() -> None:
    assert not cycles(import_graph()), "these modules import each other in a circle"


def test_the_cycle_check_would_catch_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: the core's packages and root modules, by layer: each imports only from its own layer and
#: those below it (a module at the root counts as a package of its own)
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"engine", "sdk"}),
    frozenset({"runtime", "plugin", "plugindata", "hookspecs", "api"}),
    frozenset({"config", "state"}),
    frozenset({"pluginmanager", "pluginsteps", "probing"}),
    frozenset({"reflex", "harness", "http"}),
    frozenset({"daemon"}),
    frozenset({"docs", "demo"}),
    frozenset({"cli", "__main__"}),
)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "arbiter"


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        own = _package(module)
        graph.setdefault(own, set()).update(p for p in map(_package, imported) if p not in (own, "arbiter"))
    graph.pop("arbiter", None)
    return graph


def test_no_import_cycles_between_packages() -> None:
    assert not cycles(package_graph()), "these packages import each other in a circle"


def test_no_import_runs_back_up_the_layers() -> None:
    layer = {name: n for n, names in enumerate(LAYERS) for name in names}
    graph = package_graph()
    assert set(graph) <= set(layer), f"packages with no layer in LAYERS: {set(graph) - set(layer)}"
    upward = [f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer[b] > layer[a]]
    assert not upward, "imports that run back up the layers:\n" + "\n".join(sorted(upward))


#: modules of plugin distributions that no plugin manager loads (their entry point module does
#: not import them), each with why it may import more of arbiter than the plugin API
NOT_PLUGINS = {
    "arbiter_testing/node.py": "the tests' harness: it drives the demo's node",
    "arbiter_testing/slurm.py": "the tests' Slurm cluster: it starts a daemon per node with the harness",
    "arbiter_testing/certified.py": "the tests' certified rule: it stores a certificate as a paired run does",
    "arbiter_testing/probes.py": "the probe tests' stand-in host: it builds the probes plugin's probes",
    "arbiter_testing/twins.py": "the fleet-certificate tests' twins: it makes each node's signing key as the daemon does",
    "arbiter_slurm/hooks.py": "the program slurmd runs as Prolog and Epilog: a client of the daemon's socket, as the CLI",
}
#: one plugin distribution built on another's kind, each with why
BUILT_ON = {
    ("arbiter_slurm", "arbiter_translators"): "the slurm translator's local pause is the signal translator's",
}


def test_plugins_import_only_the_plugin_api_from_arbiter() -> None:
    found = []
    for path in sorted((ROOT / "plugins").glob("*/src/**/*.py")):
        distribution = path.relative_to(ROOT / "plugins").parts[0]
        if path.relative_to(ROOT / "plugins" / distribution / "src").as_posix() in NOT_PLUGINS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            own = path.relative_to(ROOT / "plugins" / distribution / "src").parts[0]
            found += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if (n.split(".")[0] == "arbiter" and n != "arbiter.plugin")
                or (n.startswith("arbiter_") and n.split(".")[0] != own and (own, n.split(".")[0]) not in BUILT_ON)
            ]
    assert not found, "a plugin imports more of arbiter than its plugin API, or another plugin:\n" + "\n".join(found)


def test_what_is_not_a_plugin_is_not_loaded_as_one() -> None:
    for module in NOT_PLUGINS:
        package, name = module.split("/")
        init = next((ROOT / "plugins").glob(f"*/src/{package}/__init__.py"))
        project = tomllib.loads((init.parents[2] / "pyproject.toml").read_text())
        entries = project.get("project", {}).get("entry-points", {}).get("arbiter", {}).values()
        for entry in [init, *(init.parent / f"{e.split('.', 1)[1]}.py" for e in entries if "." in e)]:
            assert Path(name).stem not in entry.read_text(), f"the plugin entry point {entry.name} imports {module}"
