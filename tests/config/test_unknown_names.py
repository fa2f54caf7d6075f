"""A misspelt kind or key fails `check`, `doctor` and start-up alike, with the known names and
the closest one; a `during:` source that cannot give a phase is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.cli.doctor import local_items
from arbiter.config.errors import ConfigError
from arbiter.config.loader import parse_rule
from arbiter.config.models import Rule
from arbiter.engine.holds import effective_phase
from arbiter.engine.types import SourceObs
from arbiter.plugin import PluginContext, Source
from arbiter.pluginmanager import PluginHost
from arbiter_testing import wait_until


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arbiter", *args], capture_output=True, text=True, timeout=60, check=False
    )


def node(tmp_path: Path, body: str) -> Path:
    (tmp_path / "tenants.d").mkdir(exist_ok=True)
    path = tmp_path / "arbiter.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\ntenants_dirs: [tenants.d]\n{body}")
    return path


def doctor_config_item(path: Path) -> dict[str, object]:
    return next(i.to_dict() for i in local_items(str(path)) if i.area == "node config")


def test_a_misspelt_reader_fails_check_doctor_and_start_up(tmp_path: Path) -> None:
    path = node(tmp_path, "readers: [cpu-time]\n")
    out = cli("check", "--config", str(path))
    assert out.returncode == 1
    assert f"{path}:3:11: readers.0: unknown reader kind 'cpu-time'" in out.stdout
    assert "did you mean 'cpu_time'?" in out.stdout and "nvml" in out.stdout  # the whole list
    item = doctor_config_item(path)
    assert item["ok"] is False and "unknown reader kind 'cpu-time'" in str(item["detail"])
    out = cli("run", "--config", str(path))
    assert out.returncode == 2 and "did you mean 'cpu_time'?" in out.stderr
    assert not (tmp_path / "state" / "daemon.json").exists()


def test_check_and_doctor_agree_on_a_stand_in_reader(tmp_path: Path) -> None:
    path = node(tmp_path, "readers: [cpu_time]\n")
    assert cli("check", "--config", str(path)).returncode == 1
    item = doctor_config_item(path)
    assert item["ok"] is False and "stand_in_gpu: true" in str(item["detail"])
    path = node(tmp_path, "readers: [cpu_time]\nstand_in_gpu: true\n")
    assert cli("check", "--config", str(path)).returncode == 0
    assert doctor_config_item(path)["ok"] is True


def test_translators_must_exist_and_do_what_they_are_named_for(tmp_path: Path) -> None:
    path = node(tmp_path, "translators:\n  pause: [signl]\n  terminate: [control_doc, signal]\n")
    out = cli("check", "--config", str(path))
    assert out.returncode == 1
    assert "translators.pause.0: unknown translator kind 'signl' (did you mean 'signal'?" in out.stdout
    assert "translators.terminate.0: translator 'control_doc' cannot terminate" in out.stdout


def test_reader_options_are_checked_against_the_readers_own_model(tmp_path: Path) -> None:
    path = node(tmp_path, "readers: [{kind: nvml, colour: red}]\n")
    out = cli("check", "--config", str(path))
    assert out.returncode == 1 and "readers.0.colour: unknown key 'colour'" in out.stdout


def test_a_misspelt_key_in_the_node_config_gets_the_closest(tmp_path: Path) -> None:
    path = node(tmp_path, "http: {listn: '127.0.0.1:7999'}\ntick: 3\n")
    out = cli("check", "--config", str(path))
    assert out.returncode == 1
    assert "http.listn: unknown key 'listn' (did you mean 'listen'?" in out.stdout
    assert "tick: unknown key 'tick' (did you mean 'tick_s'?" in out.stdout


RULE = """\
id: mytrain
match: {cmdline: [train.py]}
during:
  - source: SOURCE
    pause_fleet: {scope: gpu}
"""


def parse(host: PluginHost, source: str, folder: Path) -> Rule:
    """The rule with ``source`` as its during: source, from a file in ``folder`` (file sources
    are taken only from a rule file that only root can change, as this one)."""
    path = folder / "t.yaml"
    path.write_text(RULE.replace("SOURCE", source))
    return parse_rule(path.read_text(), str(path), host.options_model, host.kind_names)


def test_a_misspelt_key_in_a_plugin_block_gets_the_closest(host: PluginHost) -> None:
    with pytest.raises(ConfigError) as err:
        parse_rule(
            RULE.replace("cmdline", "cmdlin").replace("SOURCE", "{kind: on_exec, match: {name: [x]}}"),
            "t.yaml",
            host.options_model,
            host.kind_names,
        )
    (p,) = err.value.problems
    assert p.field == "match.cmdlin" and p.hint.startswith("did you mean 'cmdline'?") and "user" in p.hint


def test_a_misspelt_kind_in_a_rule_gets_the_closest(host: PluginHost, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, "{kind: jsnol, path: /tmp/x.jsonl, enter: a, exit: b}", tmp_path)
    (p,) = err.value.problems
    assert p.field == "during.0.source.kind" and p.hint.startswith("did you mean 'jsonl'?") and "log" in p.hint


@pytest.mark.parametrize(
    "source",
    ["{kind: jsonl, path: /tmp/x.jsonl, event: step}", "{kind: log, path: /tmp/x.log, log_regex: step}"],
)
def test_a_during_source_that_gives_only_a_rate_is_refused(host: PluginHost, source: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, source, tmp_path)
    (p,) = err.value.problems
    assert (p.field, p.line) == ("during.0.source", 4) and "gives no phase" in p.message


@pytest.mark.parametrize(
    "source",
    [
        "{kind: jsonl, path: /tmp/x.jsonl, enter: a, exit: b}",
        "{kind: jsonl, path: /tmp/x.jsonl, event: s, field: state, on: [up]}",
        "{kind: on_exec, match: {name: [x]}}",
    ],
)
def test_a_during_source_that_gives_a_phase_is_taken(host: PluginHost, source: str, tmp_path: Path) -> None:
    assert parse(host, source, tmp_path).during[0].pause_fleet.scope == "gpu"


def test_a_missing_phase_file_counts_as_on(host: PluginHost, tmp_path: Path) -> None:
    info = host.kind("sources", "jsonl")
    assert info is not None and issubclass(info.cls, Source)
    options = info.cls.Options.model_validate({"path": str(tmp_path / "none.jsonl"), "enter": "a", "exit": "b"})
    source = info.cls(options, PluginContext(state_dir=tmp_path))
    source.start(lambda _state: None)
    try:
        wait_until(lambda: "does not exist" in source.state().why, 10, "the source to look for its file")
        state = source.state()
    finally:
        source.close()
    obs = SourceObs(readable=state.readable, phase=state.phase, why=state.why)
    phase, reason = effective_phase(obs, running=True, faulty=False)
    assert phase == "on" and reason is not None and "does not exist" in reason.message


def test_a_protect_source_that_gives_a_phase_is_refused(host: PluginHost, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "id: t\nmatch: {cmdline: [x]}\nprotect:\n  metric: progress_rate\n"
        "  source: {kind: jsonl, path: /tmp/x.jsonl, event: status, field: phase, on: [upload]}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_rule(path.read_text(), str(path), host.options_model, host.kind_names)
    (p,) = err.value.problems
    assert (p.field, p.line) == ("protect.source", 5) and "gives a phase" in p.message and "during:" in p.hint
