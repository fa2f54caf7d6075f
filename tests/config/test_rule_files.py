"""Rule files: two-stage validation and errors that point at a line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.config.errors import ConfigError
from arbiter.config.loader import check_paths, load_node_config, parse_manifest, parse_rule
from arbiter.config.models import Rule
from arbiter.pluginmanager import PluginHost

ROOT = Path(__file__).resolve().parents[2]


def trusted(path: str) -> None:
    """A text parsed by itself: its file's trust is another test's (tests/config/test_command_safety.py)."""
    return None


def parse(host: PluginHost, text: str) -> Rule:
    return parse_rule(text, "t.yaml", host.options_model, host.kind_names, trusted)


GOOD = """\
id: trainer
kind: trainer
priority: 50
match:
  cmdline: [train.py]
  tree: descendants
immediate: true
protect:
  metric: progress_rate
  source: {kind: jsonl, path: /tmp/events.jsonl, event: step_done}
during:
  - source: {kind: jsonl, path: /tmp/events.jsonl, event: status, field: state.phase, on: [uploading]}
    pause_fleet: {scope: gpu}
"""


def test_a_good_rule_parses_both_stages(host: PluginHost) -> None:
    rule = parse(host, GOOD)
    assert rule.id == "trainer" and rule.protected and rule.during[0].pause_fleet.scope == "gpu"


def test_outer_errors_name_line_column_and_field(host: PluginHost) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, GOOD.replace("priority: 50", "priority: high"))
    (p,) = err.value.problems
    assert (p.line, p.column, p.field) == (3, 11, "priority")
    assert str(p).startswith("t.yaml:3:11: priority: ") and "(write a whole number)" in str(p)


def test_plugin_block_errors_are_found_even_with_outer_errors(host: PluginHost) -> None:
    text = GOOD.replace("priority: 50", "priority: high").replace("cmdline: [train.py]", "cmdlin: [train.py]")
    with pytest.raises(ConfigError) as err:
        parse(host, text)
    fields = [p.field for p in err.value.problems]
    assert "priority" in fields and "match.cmdlin" in fields
    cmdlin = next(p for p in err.value.problems if p.field == "match.cmdlin")
    assert cmdlin.line == 5


def test_unknown_kind_lists_known_ones(host: PluginHost) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, GOOD.replace("{kind: jsonl, path: /tmp/events.jsonl, event: step_done}", "{kind: jsnol, path: x}"))
    (p,) = err.value.problems
    assert p.field == "protect.source.kind" and "jsonl" in p.hint and p.line == 10


def test_source_options_errors_point_into_the_list(host: PluginHost) -> None:
    with pytest.raises(ConfigError) as err:
        parse(
            host,
            GOOD.replace("field: state.phase, on: [uploading]", "field: state.phase, on: [uploading], colour: red"),
        )
    assert [p.field for p in err.value.problems] == ["during.0.source.colour"]
    assert err.value.problems[0].line == 12


def test_yaml_syntax_error_has_a_line(host: PluginHost) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, "id: x\nmatch: {name: [a]\n")
    assert err.value.problems[0].line >= 2 and "not valid YAML" in err.value.problems[0].message


def test_duplicate_ids_across_files(tmp_path: Path, host: PluginHost) -> None:
    (tmp_path / "a.yaml").write_text("id: x\nmatch: {name: [a]}\n")
    (tmp_path / "b.yaml").write_text("id: x\nmatch: {name: [b]}\n")
    ruleset = check_paths([tmp_path], host.options_model, host.kind_names)
    assert list(ruleset.rules) == ["x"]
    assert "already used" in ruleset.problems[str(tmp_path / "b.yaml")][0].message


def test_shipped_rule_files_and_examples_are_valid(host: PluginHost) -> None:
    ruleset = check_paths(
        [ROOT / "tenants.d", ROOT / "examples" / "demo" / "tenants.d"], host.options_model, host.kind_names
    )
    assert not ruleset.problems
    assert {"llm-server", "diffusion-server", "desktop-compositor", "standin-trainer"} <= set(ruleset.rules)


def test_every_shipped_block_validates_against_its_plugins_own_options(host: PluginHost) -> None:
    """Not only "some plugin took it": each block is checked by the model of the plugin that
    will run it, so a field the plugin does not know (or a wrong value) fails here."""
    from arbiter.config.loader import raw_kind_blocks, read_rule_file, validate_kind_options, with_base_url
    from arbiter.config.models import KindBlock
    from arbiter_sources.http_count import HttpCountOptions
    from arbiter_sources.websocket import WebsocketOptions
    from arbiter_translators.http import HttpPostOptions

    expected = {
        ("sources", "http_count"): HttpCountOptions,
        ("sources", "websocket"): WebsocketOptions,
        ("translators", "http_post"): HttpPostOptions,
    }
    seen = set()
    for path in sorted((ROOT / "tenants.d").glob("*.yaml")):
        rf = read_rule_file(path.read_text(), str(path))
        for loc, family, raw in raw_kind_blocks(with_base_url(rf.data)):
            kind = raw.get("kind", "process")
            model = host.options_model(family, kind)
            assert model is not None, f"{path.name}: {'.'.join(map(str, loc))}: no plugin registers {family}/{kind}"
            if (family, kind) in expected:
                assert model is expected[(family, kind)]
                seen.add((family, kind))
            validate_kind_options(KindBlock(**{**raw, "kind": kind}), model)
    assert seen == set(expected)


#: Ollama docs/api.md, "Generate a completion → Unload a model → Request" (the -d body)
DOCUMENTED_UNLOAD = {"model": "llama3.2", "keep_alive": 0}
#: the POST /free body ComfyUI takes; both flags default to false on the server
DOCUMENTED_FREE = {"unload_models": True, "free_memory": True}


def test_shipped_defaults_say_what_section_7_asks(host: PluginHost) -> None:
    rules = check_paths([ROOT / "tenants.d"], host.options_model, host.kind_names).rules
    llm, diffusion, desktop = rules["llm-server"], rules["diffusion-server"], rules["desktop-compositor"]

    assert (llm.priority, llm.idle_release_after_s) == (50, 0)
    assert llm.busy is not None and llm.release is not None
    busy, release = llm.busy.options(), llm.release.options()
    assert llm.busy.kind == "http_count" and busy["url"] == "http://127.0.0.1:11434/api/ps"
    assert busy["count_keys"] == ["models"] and busy["models_key"] == "models"
    assert llm.release.kind == "http_post" and release["url"] == "http://127.0.0.1:11434/api/generate"
    assert release["body"] == {"keep_alive": 0} and release["per_model"] is True and release["confirm"] is True
    assert release["timeout_s"] > 0
    # per_model adds the name to the body: the documented unload request
    assert {**release["body"], "model": DOCUMENTED_UNLOAD["model"]} == DOCUMENTED_UNLOAD

    assert (diffusion.priority, diffusion.idle_release_after_s) == (60, 30) and diffusion.needs_vram_gb
    assert diffusion.busy is not None and diffusion.release is not None and diffusion.events is not None
    busy, release, events = diffusion.busy.options(), diffusion.release.options(), diffusion.events.options()
    assert diffusion.busy.kind == "http_count" and busy["url"] == "http://127.0.0.1:8188/queue"
    assert busy["count_keys"] == ["queue_running", "queue_pending"] and busy["vram_floor_gb"] > 0
    assert diffusion.release.kind == "http_post" and release["url"] == "http://127.0.0.1:8188/free"
    assert release["body"] == DOCUMENTED_FREE
    assert diffusion.events.kind == "websocket" and events["url"] == "http://127.0.0.1:8188/ws"
    from arbiter_sources.websocket import WebsocketOptions

    assert WebsocketOptions.model_validate(events).url == "ws://127.0.0.1:8188/ws"  # connected as ws://

    assert desktop.priority == 90 and desktop.release is None  # never reclaimable


def test_manifest_rules() -> None:
    m = parse_manifest(
        "name: llmbatch\ncapabilities: [cooperative_throttle]\ngpu: {use: shared, max_duty: 0.5}\n"
        "variants:\n  darwin: {use: shared, apis_any: [metal]}\n",
        "m.yaml",
    )
    assert m.gpu_for("darwin").apis_any == ["metal"] and m.gpu_for("linux").max_duty == 0.5
    with pytest.raises(ConfigError) as err:
        parse_manifest("name: x\ngpu: {use: none, apis_any: [cuda]}\n", "m.yaml")
    assert "apis_any needs use: shared" in str(err.value) and err.value.problems[0].line == 2


def test_node_config_relative_paths_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "arbiter.yaml").write_text("state_dir: st\ntenants_dirs: [t.d]\n")
    monkeypatch.setenv("ARBITER_CONFIG", str(tmp_path / "arbiter.yaml"))
    cfg, path = load_node_config()
    assert path == tmp_path / "arbiter.yaml"
    assert cfg.state_dir == str(tmp_path / "st") and cfg.tenants_dirs == [str(tmp_path / "t.d")]
    with pytest.raises(ConfigError) as err:
        load_node_config(tmp_path / "missing.yaml")
    assert "no such config file" in str(err.value)
    (tmp_path / "bad.yaml").write_text("tick_s: -1\ngpu_jobs: sometimes\n")
    with pytest.raises(ConfigError) as err:
        load_node_config(tmp_path / "bad.yaml")
    assert [p.field for p in err.value.problems] == ["tick_s", "gpu_jobs"]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arbiter", *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )


def test_check_cli_reports_every_file_and_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text("id: ok\nmatch: {name: [a]}\n")
    (tmp_path / "bad.yaml").write_text("id: bad\nmatch:\n  name: [a]\npriority: lots\n")
    (tmp_path / "worse.yaml").write_text("id: [\n")
    (tmp_path / "node.yaml").write_text("tenants_dirs: []\n")
    out = run_cli("check", "--config", str(tmp_path / "node.yaml"), str(tmp_path))
    assert out.returncode == 1
    assert f"{tmp_path / 'bad.yaml'}:4:11: priority:" in out.stdout
    assert f"{tmp_path / 'worse.yaml'}:" in out.stdout
    out = run_cli("check", "--config", str(tmp_path / "node.yaml"), str(tmp_path / "good.yaml"), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["problems"] == []


def test_check_refuses_a_stand_in_reader_without_stand_in_gpu(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text("readers: [cpu_time]\ntenants_dirs: []\n")
    out = run_cli("check", "--config", str(tmp_path / "node.yaml"), str(tmp_path / "node.yaml"))
    assert out.returncode == 1 and "stand_in_gpu: true" in out.stdout


def test_schema_prints_every_document() -> None:
    out = run_cli("schema")
    schemas = json.loads(out.stdout)
    assert set(schemas) == {"node", "rule", "manifest", "control", "event"}
    assert schemas["control"]["properties"]["state"]["enum"] == ["run", "paused", "stop"]
    assert run_cli("schema", "nope").returncode == 2


def test_yaml_on_off_yes_no_are_words_not_booleans(host: PluginHost) -> None:
    rule = parse(host, GOOD.replace("on: [uploading]", "on: [on, yes]"))
    assert rule.during[0].source.options()["on"] == ["on", "yes"]
    assert parse(host, GOOD + "enabled: false\n").enabled is False
