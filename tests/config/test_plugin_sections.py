"""A plugin's section of the node config: declared through ``arbiter_register_node_sections``,
validated where the node config is judged (check, doctor, start-up) with the same errors as
arbiter's own keys, and handed to the plugin, validated, in its context."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from arbiter.cli.checks import run_check
from arbiter.config.errors import ConfigError
from arbiter.config.loader import load_node_config
from arbiter.config.schemas import schema_for
from arbiter.plugin import KindOptions, Register, hookimpl
from arbiter.pluginmanager import PluginLoadError, build_plugin_manager
from arbiter_testing.node import start_up

#: a plugin, importable by its module name from the test's folder, that reads ``backup:``
PLUGIN = """\
from pydantic import Field

from arbiter.plugin import KindOptions, hookimpl


class BackupOptions(KindOptions):
    target: str = Field(description="where the node's backups go")
    every_s: float = Field(3600, gt=0, description="how often")


@hookimpl
def arbiter_register_node_sections(register):
    register("backup", BackupOptions)
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "backupplugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tenants.d").mkdir()
    return tmp_path


def node(folder: Path, body: str, plugins: str = "plugins: [backupplugin]\n") -> Path:
    path = folder / "arbiter.yaml"
    path.write_text(f"state_dir: {folder / 'state'}\ntenants_dirs: [tenants.d]\n{plugins}{body}")
    return path


def check(path: Path) -> list[str]:
    problems, _ = run_check(str(path), [])
    return [str(p) for p in problems]


def test_a_plugins_section_is_validated_and_handed_to_it(folder: Path) -> None:
    path = node(folder, "backup:\n  target: /srv/backup\n  every_s: 60\n")
    assert check(path) == []
    cfg, _ = load_node_config(path)
    host = build_plugin_manager(cfg.plugins)
    try:
        given = host.context(cfg).sections["backup"]
        assert type(given).__name__ == "BackupOptions" and given.model_dump() == {
            "target": "/srv/backup",
            "every_s": 60.0,
        }
        # left out, a section whose model needs a value is not there; the plugin says so itself
        cfg, _ = load_node_config(node(folder, ""))
        assert "backup" not in host.context(cfg).sections
    finally:
        host.close()


def test_a_wrong_key_or_value_in_a_section_is_reported_at_its_line(folder: Path) -> None:
    path = node(folder, "backup:\n  target: /srv/backup\n  evry_s: 60\n")
    assert check(path) == [
        f"{path}:6:3: backup.evry_s: unknown key 'evry_s' (did you mean 'every_s'? known keys here: every_s, target)"
    ]
    path = node(folder, "backup:\n  target: /srv/backup\n  every_s: -1\n")
    (problem,) = check(path)
    assert problem.startswith(f"{path}:6:12: backup.every_s: Input should be greater than 0"), problem
    path = node(folder, "backup: /srv/backup\n")
    (problem,) = check(path)
    assert f"{path}:4:9: backup:" in problem and "write a mapping" in problem, problem


def test_a_misspelt_section_gets_the_closest_of_the_keys_and_sections(folder: Path) -> None:
    path = node(folder, "backpu:\n  target: /srv/backup\n")
    (problem,) = check(path)
    assert problem.startswith(f"{path}:4:1: backpu: unknown key 'backpu' (did you mean 'backup'? known keys: "), problem
    assert "tick_s" in problem and "sections of the enabled plugins: backup" in problem, problem
    # the daemon refuses to start on it, as check does
    out = start_up(path, env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and "backpu: unknown key 'backpu' (did you mean 'backup'?" in out.stderr, out.stderr


def test_the_section_of_a_plugin_not_loaded_says_so(folder: Path) -> None:
    body = "backup:\n  target: /srv/backup\n"
    (problem,) = check(node(folder, body, plugins=""))
    assert "backup: unknown key 'backup' (known keys: " in problem, problem
    assert "a plugin's section needs the plugin that reads it installed and enabled" in problem, problem
    (problem,) = check(node(folder, body, plugins="plugins: [backupplugin]\ndisable_plugins: [backupplugin]\n"))
    assert "disabled plugins (disable_plugins): backupplugin" in problem, problem


def test_a_misspelt_key_of_arbiters_own_lists_the_sections_too(folder: Path) -> None:
    path = node(folder, "tick: 3\nhttp: {listn: '127.0.0.1:7999'}\nbackpu: {}\n")
    problems = check(path)
    assert any("tick: unknown key 'tick' (did you mean 'tick_s'?" in p for p in problems), problems
    assert any("sections of the enabled plugins: backup" in p for p in problems), problems
    # a key of arbiter's own that does not validate does not hide the sections' problems
    assert any("http.listn: unknown key 'listn'" in p for p in problems), problems
    assert any("backpu: unknown key 'backpu' (did you mean 'backup'?" in p for p in problems), problems


class Good(KindOptions):
    on: bool = True


def test_the_node_configs_schema_takes_the_plugins_sections_and_no_other_key() -> None:
    host = build_plugin_manager(entry_points=False, extra=[("p", plugin_registering("backup", Good))])
    try:
        schema = schema_for("node", sections=host.section_models())
    finally:
        host.close()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["backup"] == {"$ref": "#/$defs/sections.backup"}
    assert set(schema["$defs"]["sections.backup"]["properties"]) == {"on"}
    assert schema_for("node")["additionalProperties"] is True  # the plugins unknown: any section


def plugin_registering(name: str, model: type) -> object:
    class Plugin:
        @hookimpl
        def arbiter_register_node_sections(self, register: Register) -> None:
            register(name, model)

    return Plugin()


@pytest.mark.parametrize(
    ("name", "model", "said"),
    [
        ("tick_s", Good, "a key arbiter has"),
        ("reader", Good, "so close to arbiter's key 'readers' that it would be taken for it misspelt"),
        ("Backup", Good, "lower-case letters, digits and _"),
        ("backup", BaseModel, "not a subclass of arbiter.plugin.KindOptions"),
    ],
)
def test_a_section_a_plugin_may_not_have_is_refused_as_it_loads(name: str, model: type, said: str) -> None:
    with pytest.raises(PluginLoadError, match=said):
        build_plugin_manager(entry_points=False, extra=[("p", plugin_registering(name, model))])


def test_two_plugins_may_not_register_the_same_section() -> None:
    with pytest.raises(PluginLoadError, match="registered by both one and two"):
        build_plugin_manager(
            entry_points=False,
            extra=[("one", plugin_registering("backup", Good)), ("two", plugin_registering("backup", Good))],
        )


def test_a_misspelt_key_of_arbiters_own_is_refused_wherever_the_config_is_read(tmp_path: Path) -> None:
    """Commands that read the config without its plugins (status, job run, the hooks) cannot
    tell a plugin's section from an unknown key; one that is an arbiter key misspelt they can."""
    path = tmp_path / "arbiter.yaml"
    path.write_text(f"stat_dir: {tmp_path}\nslurm: {{node: n1}}\n")
    with pytest.raises(
        ConfigError, match=r"arbiter.yaml:1:1: stat_dir: unknown key 'stat_dir' \(did you mean 'state_dir'"
    ):
        load_node_config(path)
    path.write_text(f"state_dir: {tmp_path}\nslurm: {{node: n1}}\n")
    assert load_node_config(path)[0].sections() == {"slurm": {"node": "n1"}}
