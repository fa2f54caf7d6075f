"""The out-of-tree example plugin, installed the way a user installs one, loads through its entry
point: `arbiter plugins` lists it, `arbiter check` validates rule files that use its kinds, and a
running daemon pauses fleet work on its source's phase."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from arbiter_testing.node import PYTHON, HarnessNode

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugins" / "arbiter-example-files"
DIST = "arbiter-example-files"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example built and installed into a folder outside the checkout (no dependencies:
    arbiter itself comes from the test's environment)."""
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build the example plugin (run the tests with `uv run pytest`)"
    target = tmp_path_factory.mktemp("example-site")
    done = subprocess.run(
        [uv, "pip", "install", "--no-deps", "--target", str(target), str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"installing {EXAMPLE} failed:\n{done.stdout}\n{done.stderr}"
    assert (target / "arbiter_example_files" / "__init__.py").exists()
    return target


def env_with(site: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ARBITER_CONFIG", "PYTHONPATH")}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


def arbiter(site: Path | None, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arbiter", *args],
        capture_output=True,
        text=True,
        env=env_with(site),
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_it_is_not_a_workspace_member() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members = root["tool"]["uv"]["workspace"]["members"]
    where = str(EXAMPLE.relative_to(ROOT))
    assert not any(fnmatch.fnmatch(where, m) for m in members), f"{where} must stay out of the workspace ({members})"
    lock = ROOT / "uv.lock"  # there is none where the environment was installed from constraints.txt
    assert not lock.exists() or DIST not in lock.read_text(), "uv.lock names the example: uv sync would install it"
    pyproject = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["arbiter"] == {"example-files": "arbiter_example_files"}


def test_it_imports_only_the_plugin_api_from_arbiter() -> None:
    import ast

    for path in EXAMPLE.joinpath("src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            for name in names:
                if name.split(".")[0] == "arbiter":
                    assert name == "arbiter.plugin", f"{path.name} imports {name}"


def test_arbiter_plugins_lists_it_through_its_entry_point(site: Path) -> None:
    import json

    listed = arbiter(site, "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    plugin = next((p for p in json.loads(listed.stdout) if p["name"] == "example-files"), None)
    assert plugin is not None, f"example-files is not listed:\n{listed.stdout}"
    assert plugin["distribution"] == f"{DIST} 0.1.0"
    assert plugin["kinds"] == ["sources/counter_file", "sources/flag_file"]
    without = arbiter(None, "plugins", "--json")
    assert "example-files" not in without.stdout  # it came from the folder installed into, nothing else


def write_tenants(tmp_path: Path, blocks: Callable[[str, str], list[tuple[str, str]]]) -> Path:
    """The rule files docs/plugins.md shows, as a tenants.d of their own."""
    tenants = tmp_path / "tenants.d"
    tenants.mkdir()
    rules = [(name, text) for name, text in blocks("plugins.md", "yaml") if name.startswith("tenants.d/")]
    assert len(rules) >= 2, "docs/plugins.md should show rule files using flag_file and counter_file"
    for name, text in rules:
        (tmp_path / name).write_text(text)
    (tmp_path / "arbiter.yaml").write_text("tenants_dirs: [tenants.d]\n")
    return tenants


def test_check_accepts_rule_files_using_its_kinds(
    site: Path, tmp_path: Path, blocks: Callable[[str, str], list[tuple[str, str]]]
) -> None:
    tenants = write_tenants(tmp_path, blocks)
    kinds = "".join(p.read_text() for p in tenants.iterdir())
    assert "kind: flag_file" in kinds and "kind: counter_file" in kinds
    checked = arbiter(site, "check", "--config", str(tmp_path / "arbiter.yaml"), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 problem(s)" in checked.stderr


def test_check_names_file_line_and_field_of_a_bad_option(
    site: Path, tmp_path: Path, blocks: Callable[[str, str], list[tuple[str, str]]]
) -> None:
    tenants = write_tenants(tmp_path, blocks)
    renderer = tenants / "renderer.yaml"
    text = renderer.read_text()
    assert "poll_s: 0.5" in text
    renderer.write_text(text.replace("poll_s: 0.5", "poll_s: 0"))
    bad = arbiter(site, "check", "--config", str(tmp_path / "arbiter.yaml"), "tenants.d", cwd=tmp_path)
    assert bad.returncode == 1
    line = next(n for n, row in enumerate(renderer.read_text().splitlines(), 1) if "poll_s" in row)
    assert f"tenants.d/renderer.yaml:{line}:" in bad.stdout, bad.stdout
    assert "protect.source.poll_s: Input should be greater than 0" in bad.stdout

    renderer.write_text(text.replace("path: /var/lib/render/frames-done", "path: frames-done"))
    relative = arbiter(site, "check", "--config", str(tmp_path / "arbiter.yaml"), "tenants.d", cwd=tmp_path)
    assert (
        relative.returncode == 1
        and "protect.source.path" in relative.stdout
        and "not an absolute path" in relative.stdout
    )

    unknown = arbiter(None, "check", "--config", str(tmp_path / "arbiter.yaml"), "tenants.d", cwd=tmp_path)
    assert unknown.returncode == 1 and "unknown source kind 'counter_file'" in unknown.stdout


def test_its_own_tests_pass_installed(site: Path) -> None:
    done = subprocess.run(
        # in this process (-n 0): the repository's addopts would start workers of its own
        [sys.executable, "-m", "pytest", "-q", "-n", "0", str(EXAMPLE / "tests")],
        capture_output=True,
        text=True,
        env=env_with(site),
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[HarnessNode]:
    n = HarnessNode(tmp_path)
    yield n
    n.close()


def stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def test_a_daemon_pauses_fleet_work_while_its_flag_file_exists(site: Path, node: HarnessNode, tmp_path: Path) -> None:
    token = f"example-files-{uuid.uuid4().hex[:8]}"
    flag = tmp_path / "backup.flag"
    node.add_rule(
        "backup",
        {
            "id": "backup",
            "match": {"cmdline": [token]},
            "immediate": True,
            "during": [
                {"source": {"kind": "flag_file", "path": str(flag), "poll_s": 0.05}, "pause_fleet": {"scope": "gpu"}}
            ],
        },
    )
    node.start(PYTHONPATH=str(site))
    node.spawn([PYTHON, "-c", "import time, sys; time.sleep(600)", token])
    node.job_run([PYTHON, "-m", "arbiter.demo.job", "--plain"], "--name", "plain")
    pid = node.job_pid("plain", timeout=30)
    node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=30)

    def phase() -> str | None:
        return next((s.get("phase") for s in node.status()["rules"][0]["sources"] if s.get("phase")), None)

    assert node.wait_for(lambda: phase() == "off", timeout=30)
    assert not stopped(pid)
    flag.touch()
    node.wait_for(lambda: stopped(pid), timeout=30)
    assert node.reasons("plain", "PROTECTION_PHASE_ON")
    assert phase() == "on"
    flag.unlink()
    node.wait_for(lambda: not stopped(pid), timeout=30)
    assert node.events("PROTECTION_PHASE_OFF", subject="backup")


def test_the_tutorial_quotes_the_example_as_it_is(blocks: Callable[[str, str], list[tuple[str, str]]]) -> None:
    source = "".join(p.read_text() for p in sorted(EXAMPLE.rglob("*.py")))
    quoted = blocks("plugins.md", "python")
    assert len(quoted) >= 4
    for _, text in quoted:
        assert text in source, f"docs/plugins.md quotes code that is not in {EXAMPLE.name} any more:\n{text}"
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    for _, text in blocks("plugins.md", "toml"):
        shown = tomllib.loads(text)
        assert shown["project"]["entry-points"] == project["project"]["entry-points"]
        assert shown["build-system"] == project["build-system"]
