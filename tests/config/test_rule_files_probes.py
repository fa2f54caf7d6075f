"""`arbiter check`'s errors for the value probes, tqdm's count and the way back: each names
file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiter.config.errors import ConfigError
from arbiter.config.loader import parse_rule
from arbiter.config.models import Rule
from arbiter.pluginmanager import PluginHost

BASE = """\
id: vllm
priority: 50
match:
  cmdline: [vllm serve]
busy:
  kind: prometheus
  url: http://127.0.0.1:8000/metrics
  metrics: ["vllm:num_requests_running"]
  busy_when: "> 0"
release:
  kind: http_post
  url: http://127.0.0.1:8000/sleep?level=1
reacquire:
  kind: http_post
  url: http://127.0.0.1:8000/wake_up
reacquire_after_s: 10
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the rule files are written: a folder only root can change, as the requests a
    rule sends are taken only from such a file."""
    return tmp_path_factory.mktemp("rules")


def parse(host: PluginHost, text: str, folder: Path) -> Rule:
    path = folder / "t.yaml"
    path.write_text(text)
    return parse_rule(text, str(path), host.options_model, host.kind_names)


def problems(host: PluginHost, text: str, folder: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as err:
        parse(host, text, folder)
    return [(p.line, p.field, str(p)) for p in err.value.problems]


def test_the_base_is_valid(host: PluginHost, folder: Path) -> None:
    rule = parse(host, BASE, folder)
    assert rule.reacquire is not None and rule.reacquire_after_s == 10


@pytest.mark.parametrize(
    ("old", "new", "line", "field", "says"),
    [
        ('busy_when: "> 0"', 'busy_when: "running"', 9, "busy.busy_when", "does not start with a comparison"),
        ('["vllm:num_requests_running"]', '["a b"]', 8, "busy.metrics", "not a metric selector"),
        ("  url: http://127.0.0.1:8000/wake_up", "  url: http://127.0.0.1:8000/wake_up\n  colour: red", 16,
         "reacquire.colour", "unknown key 'colour'"),
        ("reacquire_after_s: 10", "reacquire_after_s: -1", 16, "reacquire_after_s", "greater than or equal"),
        ("kind: prometheus", "kind: http_value\n  field: is_sleeping", 9, "busy.metrics", "unknown key 'metrics'"),
    ],
)  # fmt: skip
def test_each_new_option_is_checked_where_it_is(
    host: PluginHost, folder: Path, old: str, new: str, line: int, field: str, says: str
) -> None:
    found = problems(host, BASE.replace(old, new, 1), folder)
    assert any(ln == line and fd == field and says in text for ln, fd, text in found), found


def test_a_reacquire_without_a_release_is_refused(host: PluginHost, folder: Path) -> None:
    text = BASE.replace("release:\n  kind: http_post\n  url: http://127.0.0.1:8000/sleep?level=1\n", "")
    ((_, _, message),) = problems(host, text, folder)
    assert "add a release: block" in message


def test_a_log_regex_group_named_almost_count(host: PluginHost, folder: Path) -> None:
    text = (
        "id: t\nmatch: {cmdline: [train.py]}\nprotect:\n  source:\n    kind: log\n    path: /tmp/t.log\n"
        "    log_regex: '(?P<n>\\d+)/'\n"
    )
    ((line, field, message),) = problems(host, text, folder)
    assert (line, field) == (7, "protect.source.log_regex") and "did you mean (?P<count>" in message


def test_the_rule_schema_holds_each_kinds_options(host: PluginHost) -> None:
    import jsonschema
    import yaml

    from arbiter.config.schemas import schema_for

    def kinds(family: str) -> dict[str, object]:
        return {n: host.options_model(family, n) for n in host.kind_names(family)}

    schema = schema_for("rule", kinds)  # type: ignore[arg-type]
    assert "busy_when" in schema["$defs"]["sources.http_value"]["properties"]
    assert "metrics" in schema["$defs"]["sources.prometheus"]["properties"]
    validator = jsonschema.Draft202012Validator(schema)
    base = yaml.safe_load(BASE)
    assert not list(validator.iter_errors(base))
    for where, typo in (("busy", "busy_whn"), ("reacquire", "urll"), ("release", "timeout")):
        bad = {**base, where: {**base[where], typo: 1}}
        assert list(validator.iter_errors(bad)), f"a typo in {where} passes the schema"
    tqdm = {
        "id": "t",
        "match": {"cmdline": ["x"]},
        "protect": {"source": {"kind": "log", "path": "/t", "log_regx": "a"}},
    }
    assert list(validator.iter_errors(tqdm))
