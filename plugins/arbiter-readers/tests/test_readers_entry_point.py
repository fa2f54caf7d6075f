"""The distribution registers through the arbiter entry point group, as a third party would."""

from __future__ import annotations

from importlib.metadata import entry_points

import pluggy

import arbiter.hookspecs
from arbiter.plugin import PROJECT


def test_entry_point_loads_and_registers_its_kinds() -> None:
    (ep,) = [e for e in entry_points(group=PROJECT) if e.name == "readers"]
    module = ep.load()
    assert module.__name__ == "arbiter_readers"
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(arbiter.hookspecs)
    pm.register(module)  # checks each implementation against its spec
    pm.check_pending()  # and that every implementation has one
    kinds: dict[str, type] = {}
    pm.hook.arbiter_register_readers(register=lambda name, cls: kinds.__setitem__(name, cls))
    assert sorted(kinds) == sorted("cpu_time".split(","))
    for cls in kinds.values():
        assert getattr(cls, "Options").model_config.get("extra") == "forbid"
