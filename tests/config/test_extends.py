"""``extends:``: a rule file that gives only what it changes in a shipped default, and gets
everything else, including fields a later version of the default adds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.config.errors import Problem
from arbiter.config.loader import RuleSet, check_paths, merge_rule_files, read_rule_file
from arbiter.config.models import NodeConfig, Rule
from arbiter.daemon.rules import RuleBook
from arbiter.pluginmanager import PluginHost

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_LLM = ROOT / "tenants.d" / "llm-server.yaml"


def check(host: PluginHost, *paths: Path, bases: tuple[Path, ...] = ()) -> RuleSet:
    return check_paths(list(paths), host.options_model, host.kind_names, bases=bases)


def problems(ruleset: RuleSet) -> list[Problem]:
    return [p for ps in ruleset.problems.values() for p in ps]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A tenants dir holding the shipped LLM server default."""
    folder = tmp_path / "tenants.d"
    folder.mkdir()
    shutil.copy(SHIPPED_LLM, folder / "llm-server.yaml")
    return folder


# --- what an extension gets --------------------------------------------------------------------


def test_an_override_that_changes_only_priority_keeps_the_shipped_blocks(host: PluginHost, shipped: Path) -> None:
    base = check(host, shipped).rules["llm-server"]
    override = write(shipped, "zz-local.yaml", "extends: llm-server\npriority: 70\n")
    ruleset = check(host, shipped)
    assert not ruleset.problems
    assert list(ruleset.rules) == ["llm-server"]  # the base does not load by itself
    rule = ruleset.rules["llm-server"]
    assert ruleset.files["llm-server"] == str(override)
    assert rule.priority == 70 and rule.extends == "llm-server"
    assert rule.busy == base.busy and rule.release == base.release and rule.match == base.match
    assert rule.idle_release_after_s == base.idle_release_after_s == 0
    assert rule.model_dump(exclude={"priority", "extends"}) == base.model_dump(exclude={"priority", "extends"})


def test_a_field_added_later_to_the_base_reaches_an_extension_written_earlier(host: PluginHost, shipped: Path) -> None:
    write(shipped, "zz-local.yaml", "extends: llm-server\npriority: 70\nrelease:\n  timeout_s: 5\n")
    before = check(host, shipped).rules["llm-server"]
    assert before.busy is not None
    assert before.needs_vram_gb is None and "every_s" not in before.busy.options()
    # a later version of the default: a new top-level field and a new option inside busy:
    newer = SHIPPED_LLM.read_text() + "needs_vram_gb: 8\n"
    newer = newer.replace("  models_key: models\n", "  models_key: models\n  every_s: 1\n")
    (shipped / "llm-server.yaml").write_text(newer)
    after = check(host, shipped).rules["llm-server"]
    assert after.busy is not None and after.release is not None
    assert after.needs_vram_gb == 8 and after.busy.options()["every_s"] == 1
    # the extension's own changes still hold, and the release it touched merged key by key
    release = after.release.options()
    assert after.priority == 70 and release["timeout_s"] == 5
    assert (
        release["per_model"] is True
        and release["body"] == {"keep_alive": 0}
        and release["url"].endswith("/api/generate")
    )


def test_mappings_merge_and_everything_else_replaces(host: PluginHost, shipped: Path) -> None:
    write(
        shipped,
        "zz-local.yaml",
        (
            "extends: llm-server\n"
            "match:\n  name: [my-llm]\n"  # a list replaces the base's list
            "release: null\n"  # null takes a block away: never reclaimed
            "busy:\n  kind: vram\n  above_gb: 2\n"  # another kind replaces the block whole
            "notes: mine\n"
        ),
    )
    ruleset = check(host, shipped)
    assert not ruleset.problems, problems(ruleset)
    rule = ruleset.rules["llm-server"]
    assert rule.match.options() == {"name": ["my-llm"], "tree": "descendants"}
    assert rule.release is None and rule.notes == "mine"
    assert rule.busy is not None and rule.busy.kind == "vram" and rule.busy.options() == {"above_gb": 2}


def test_an_extension_may_set_its_own_id_or_repeat_the_base_one(host: PluginHost, shipped: Path) -> None:
    mine = write(shipped, "zz-local.yaml", "id: my-llm\nextends: llm-server\n")
    assert list(check(host, shipped).rules) == ["my-llm"]
    mine.write_text("id: llm-server\nextends: llm-server\npriority: 55\n")
    ruleset = check(host, shipped)
    assert not ruleset.problems and ruleset.rules["llm-server"].priority == 55


def test_an_extension_of_an_extension(host: PluginHost, shipped: Path) -> None:
    write(shipped, "site.yaml", "id: site-llm\nextends: llm-server\npriority: 60\nnotes: site\n")
    write(shipped, "user.yaml", "extends: site-llm\npriority: 65\n")
    ruleset = check(host, shipped)
    assert not ruleset.problems, problems(ruleset)
    assert list(ruleset.rules) == ["site-llm"]
    rule = ruleset.rules["site-llm"]
    assert rule.busy is not None and (rule.priority, rule.notes, rule.busy.kind) == (65, "site", "http_count")
    assert ruleset.files["site-llm"] == str(shipped / "user.yaml")


def test_merged_positions_name_the_file_each_value_came_from(shipped: Path) -> None:
    base = read_rule_file(SHIPPED_LLM.read_text(), "base.yaml")
    ext = read_rule_file("extends: llm-server\nbusy:\n  url: http://127.0.0.1:1/api/ps\n", "ext.yaml")
    merged = merge_rule_files([base, ext])
    assert merged.origins[("busy", "url")] == "ext.yaml" and merged.positions[("busy", "url")] == (3, 8)
    assert merged.origins[("busy", "count_keys")] == "base.yaml"
    assert merged.origins[()] == "ext.yaml"  # what is missing is the top file's to add
    assert base.data["busy"]["url"] == "/api/ps"  # the files' own values are untouched


# --- errors ------------------------------------------------------------------------------------


def test_an_unknown_base_names_the_line_and_the_known_ids(host: PluginHost, shipped: Path) -> None:
    path = write(shipped, "zz-local.yaml", "priority: 70\nextends: llm-sever\n")
    (p,) = problems(check(host, shipped))
    assert (p.file, p.line, p.column, p.field) == (str(path), 2, 10, "extends")
    assert "'llm-sever'" in p.message and "no other rule file" in p.message
    assert "did you mean 'llm-server'?" in p.hint and "tenants_dirs" in p.hint


def test_a_base_extended_twice_is_an_error_in_both_extensions(host: PluginHost, shipped: Path) -> None:
    a = write(shipped, "a.yaml", "extends: llm-server\npriority: 70\n")
    b = write(shipped, "b.yaml", "extends: llm-server\npriority: 40\n")
    ruleset = check(host, shipped)
    assert not ruleset.rules  # neither wins by its file name, and the base is not loaded alone either
    found = {p.file: p for p in problems(ruleset)}
    assert set(found) == {str(a), str(b)}
    assert str(b) in found[str(a)].message and str(a) in found[str(b)].message
    assert found[str(a)].field == "extends" and found[str(a)].line == 1
    assert "extended once" in found[str(a)].hint


def test_a_cycle_is_an_error_naming_it(host: PluginHost, tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "id: a\nextends: b\nmatch: {name: [x]}\n")
    write(tmp_path, "b.yaml", "id: b\nextends: a\nmatch: {name: [y]}\n")
    ruleset = check(host, tmp_path)
    assert not ruleset.rules
    found = problems(ruleset)
    assert sorted(Path(p.file).name for p in found) == ["a.yaml", "b.yaml"]
    for p in found:
        assert p.field == "extends" and p.line == 2 and "cycle" in p.message
        assert "a.yaml (id a) → b.yaml (id b)" in p.message or "b.yaml (id b) → a.yaml (id a)" in p.message
        assert "remove extends" in p.hint


def test_a_file_cannot_be_its_own_base(host: PluginHost, tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "id: a\nextends: a\nmatch: {name: [x]}\n")
    (p,) = problems(check(host, tmp_path))
    assert p.field == "extends" and "no other rule file" in p.message


def test_extends_must_be_one_id(host: PluginHost, shipped: Path) -> None:
    write(shipped, "zz-local.yaml", "extends: [llm-server]\n")
    (p,) = problems(check(host, shipped))
    assert p.field == "extends" and "list" in p.message and "extends: ID" in p.hint


def test_a_bad_value_points_at_the_file_that_holds_it(host: PluginHost, shipped: Path) -> None:
    override = write(shipped, "zz-local.yaml", "extends: llm-server\npriority: lots\nbusy:\n  every_s: -1\n")
    found = {p.field: p for p in problems(check(host, shipped))}
    assert (found["priority"].file, found["priority"].line) == (str(override), 2)
    assert (found["busy.every_s"].file, found["busy.every_s"].line) == (str(override), 4)
    # a value the base wrote that the merged rule rejects is the base's line
    write(shipped, "zz-local.yaml", "extends: llm-server\nbusy:\n  kind: vram\n  above_gb: 1\n  every_s: 1\n")
    (p,) = problems(check(host, shipped))
    assert p.file == str(override) and p.field == "busy.every_s" and "remove it" in p.hint
    base = shipped / "llm-server.yaml"
    base.write_text(SHIPPED_LLM.read_text().replace("tree: descendants", "tree: everything"))
    override.write_text("extends: llm-server\npriority: 70\n")
    (p,) = problems(check(host, shipped))
    line = next(n for n, text in enumerate(base.read_text().splitlines(), 1) if "tree: everything" in text)
    assert (p.file, p.line, p.field) == (str(base), line, "match.tree")


def test_a_base_that_cannot_be_read_is_named_in_the_hint(host: PluginHost, shipped: Path) -> None:
    (shipped / "llm-server.yaml").write_text("id: llm-server\nmatch: {name: [ollama]\n")
    write(shipped, "zz-local.yaml", "extends: llm-server\n")
    found = problems(check(host, shipped))
    assert {Path(p.file).name for p in found} == {"llm-server.yaml", "zz-local.yaml"}
    unknown = next(p for p in found if p.field == "extends")
    assert "llm-server.yaml" in unknown.hint and "could not be read" in unknown.hint


def test_schema_shows_extends() -> None:
    schema = Rule.model_json_schema()["properties"]["extends"]
    assert "later version" in schema["description"] and "extended once" in schema["description"]


# --- arbiter check and the daemon --------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arbiter", *args], check=False, capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_arbiter_check_finds_a_single_files_base_in_the_tenants_dirs(tmp_path: Path, shipped: Path) -> None:
    node = write(tmp_path, "node.yaml", f"tenants_dirs: [{shipped}]\n")
    override = write(tmp_path, "local.yaml", "extends: llm-server\npriority: 70\n")
    out = run_cli("check", "--config", str(node), str(override))
    assert out.returncode == 0, out.stdout + out.stderr
    override.write_text("extends: llm-servr\n")
    out = run_cli("check", "--config", str(node), str(override))
    assert (
        out.returncode == 1
        and f"{override}:1:10: extends:" in out.stdout
        and "did you mean 'llm-server'?" in out.stdout
    )
    assert run_cli("check", "--config", str(node), str(ROOT / "tenants.d")).returncode == 0


def rulebook(folder: Path, records: list[tuple[str, str, str]], host: PluginHost) -> RuleBook:
    config = NodeConfig(tenants_dirs=[str(folder)], state_dir=str(folder.parent / "state"))
    return RuleBook(
        config,
        host,
        None,
        lambda rid, index, state: None,
        lambda code, subject, msg, data: records.append((code, subject, msg)),
    )


def test_the_daemon_loads_the_merged_rule_and_keeps_the_last_good_one(host: PluginHost, tmp_path: Path) -> None:
    # plain match-only rules: nothing here starts a probe
    folder = tmp_path / "tenants.d"
    folder.mkdir()
    write(folder, "base.yaml", "id: base\npriority: 50\nmatch: {name: [prog]}\nnotes: shipped\n")
    ext = write(folder, "local.yaml", "extends: base\npriority: 70\n")
    records: list[tuple[str, str, str]] = []
    book = rulebook(folder, records, host)
    try:
        assert book.load()
        assert list(book.live) == ["base"] and not book.problems
        live = book.live["base"]
        assert (live.rule.priority, live.rule.notes, live.path) == (70, "shipped", str(ext))

        # a later base version reaches the running daemon on reload
        write(folder, "base.yaml", "id: base\npriority: 50\nmatch: {name: [prog]}\nnotes: newer\n")
        assert book.load() and book.live["base"].rule.notes == "newer"

        # a broken extension keeps the rule its last good version made
        ext.write_text("extends: base\npriority: high\n")
        book.load()
        assert book.live["base"].rule.priority == 70 and not book.invalid_files
        assert any(code == "CONFIG_REJECTED" and "kept the last good version" in msg for code, _, msg in records)
        assert book.problems[str(ext)][0].field == "priority"

        # a broken base too: the rule stands on both files' last good versions
        write(folder, "base.yaml", "id: base\nmatch: {name: [prog]\n")
        book.load()
        assert book.live["base"].rule.notes == "newer" and not book.invalid_files

        # a new file that extends the base a second time never was valid: it holds GPU work,
        # and takes nothing away from the rule in force
        ext.write_text("extends: base\npriority: 70\n")
        write(folder, "base.yaml", "id: base\npriority: 50\nmatch: {name: [prog]}\nnotes: newer\n")
        book.load()
        second = write(folder, "second.yaml", "extends: base\npriority: 10\n")
        book.load()
        assert book.invalid_files == [str(second)]
        assert book.live["base"].rule.priority == 70
    finally:
        book.close()


def test_the_daemon_reports_an_unknown_base_and_holds_gpu_work(host: PluginHost, tmp_path: Path) -> None:
    folder = tmp_path / "tenants.d"
    folder.mkdir()
    ext = write(folder, "local.yaml", "extends: nothing-here\npriority: 70\n")
    records: list[tuple[str, str, str]] = []
    book = rulebook(folder, records, host)
    try:
        book.load()
        assert book.invalid_files == [str(ext)] and not book.live
        code, subject, msg = records[-1]
        assert (code, subject) == ("CONFIG_REJECTED", str(ext)) and "never valid" in msg and ":1:10: extends:" in msg
    finally:
        book.close()


def test_a_shipped_default_is_a_base_without_its_folder_in_tenants_dirs(host: PluginHost, tmp_path: Path) -> None:
    """`extends:` finds the shipped defaults; those nothing extends stay out of force."""
    folder = tmp_path / "tenants.d"
    folder.mkdir()
    ext = write(folder, "compositor.yaml", "extends: desktop-compositor\npriority: 95\n")
    ruleset = check(host, folder)
    assert not ruleset.problems and list(ruleset.rules) == ["desktop-compositor"]
    assert ruleset.rules["desktop-compositor"].priority == 95
    node = write(tmp_path, "node.yaml", f"tenants_dirs: [{folder}]\nstate_dir: {tmp_path / 'state'}\n")
    out = run_cli("check", "--config", str(node))
    assert out.returncode == 0, out.stdout + out.stderr
    records: list[tuple[str, str, str]] = []
    book = rulebook(folder, records, host)
    try:
        assert book.load()
        assert list(book.live) == ["desktop-compositor"] and not book.problems and not book.invalid_files
        live = book.live["desktop-compositor"]
        assert (live.rule.priority, live.path) == (95, str(ext))
        assert live.rule.match.options() == check(host, ROOT / "tenants.d").rules["desktop-compositor"].match.options()
    finally:
        book.close()


def test_another_port_is_one_line(host: PluginHost, shipped: Path) -> None:
    shutil.copy(ROOT / "tenants.d" / "diffusion-server.yaml", shipped / "diffusion-server.yaml")
    write(shipped, "mine.yaml", "extends: diffusion-server\nbase_url: http://127.0.0.1:9188\n")
    ruleset = check(host, shipped)
    assert not ruleset.problems, problems(ruleset)
    rule = ruleset.rules["diffusion-server"]
    urls = [b.options()["url"] for b in (rule.busy, rule.release, rule.events) if b is not None]
    assert urls == ["http://127.0.0.1:9188/queue", "http://127.0.0.1:9188/free", "http://127.0.0.1:9188/ws"]
    write(shipped, "mine.yaml", "extends: diffusion-server\nbase_url: 127.0.0.1:9188\n")
    assert any("base_url is a scheme, host and port" in str(p) for p in problems(check(host, shipped)))


def test_a_rule_whose_file_is_deleted_leaves_a_timeline_entry(host: PluginHost, tmp_path: Path) -> None:
    folder = tmp_path / "tenants.d"
    folder.mkdir()
    path = write(folder, "game.yaml", "id: game\nmatch: {name: [prog]}\n")
    records: list[tuple[str, str, str]] = []
    book = rulebook(folder, records, host)
    try:
        assert book.load() and list(book.live) == ["game"]
        path.unlink()
        assert book.load() and not book.live
        (entry,) = [r for r in records if "unloaded" in r[2]]
        assert entry[:2] == ("CONFIG_RELOADED", "game") and str(path) in entry[2] and "gone" in entry[2]
    finally:
        book.close()


def test_a_file_others_may_change_with_a_trusted_bases_id_does_not_block_its_extension(host: PluginHost) -> None:
    """Root's ``tuned`` extends root's ``base``; a file in a folder another account may write
    also says ``id: base``: root's extension still finds root's base (before, neither loaded
    as root meant, and the base stood alone)."""
    from arbiter.config.rules import resolve_rules

    base = "id: base\nmatch: {kind: process, cmdline: [trainer]}\nprotect: {metric: gpu_share}\n"
    files: dict[str, str | list[Problem]] = {
        "/etc/arbiter/tenants.d/base.yaml": base,
        "/etc/arbiter/tenants.d/tuned.yaml": "id: tuned\nextends: base\npriority: 90\n",
        "/home/mallory/tenants.d/base.yaml": base.replace("protect: {metric: gpu_share}\n", ""),
    }

    def others_may_change(path: str) -> str | None:
        return "others may change it" if path.startswith("/home/") else None

    resolved = resolve_rules(files, host.options_model, host.kind_names, command_check=others_may_change)
    assert resolved.extended["/etc/arbiter/tenants.d/base.yaml"] == "/etc/arbiter/tenants.d/tuned.yaml"
    rule = resolved.rules["/etc/arbiter/tenants.d/tuned.yaml"]
    assert rule.priority == 90 and rule.protect is not None
