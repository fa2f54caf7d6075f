"""The host plugin registers its three kinds, each a HostSignal, through the entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import arbiter_host
from arbiter.plugin import HostSignal
from arbiter_host import AccessHostSignal, MachineHostSignal, MemoryHostSignal, PowerHostSignal, arbiter_register_host


def test_registers_every_host_kind() -> None:
    seen: dict[str, type[HostSignal]] = {}
    arbiter_register_host(lambda name, cls: seen.__setitem__(name, cls))
    assert seen == {
        "memory": MemoryHostSignal,
        "power": PowerHostSignal,
        "machine": MachineHostSignal,
        "access": AccessHostSignal,
    }
    assert all(issubclass(cls, HostSignal) for cls in seen.values())
    assert all(cls.Options.runs_command is False for cls in seen.values())


def test_found_through_the_arbiter_entry_point_group() -> None:
    (entry,) = [e for e in entry_points(group="arbiter") if e.name == "host"]
    assert entry.load() is arbiter_host


def test_module_docstring_lists_every_kind() -> None:
    doc = arbiter_host.__doc__ or ""
    for kind in ("``memory``", "``power``", "``machine``"):
        assert kind in doc


def test_imports_only_the_public_plugin_api_from_arbiter() -> None:
    import ast
    from pathlib import Path

    for path in Path(arbiter_host.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name == "arbiter" or name.startswith("arbiter."):
                    assert name == "arbiter.plugin", f"{path.name} imports {name}"
