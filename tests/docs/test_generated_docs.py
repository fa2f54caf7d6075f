"""The generated references match the code, and the pages hang together."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from arbiter import docs
from arbiter.config import jobdocs, models

ROOT = Path(__file__).resolve().parents[2]


def test_generated_pages_match_the_code() -> None:
    stale = [page for page, (old, new) in docs.generate(ROOT).items() if old != new]
    assert not stale, (
        f"{', '.join(stale)} differ from what the code says: run `{docs.REGENERATE}` and commit the result"
    )


def _models_below(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for info in model.model_fields.values():
        for name in re.findall(r"[A-Za-z_]\w*", repr(info.annotation)):
            nested = getattr(models, name, None)
            if isinstance(nested, type) and issubclass(nested, BaseModel):
                _models_below(nested, seen)


def test_every_documented_field_has_a_description() -> None:
    seen: set[type[BaseModel]] = set()
    for top in (models.Rule, models.NodeConfig, jobdocs.Manifest):
        _models_below(top, seen)
    missing = [f"{m.__name__}.{n}" for m in seen for n, info in m.model_fields.items() if not info.description]
    assert not missing, (
        "give these fields Field(description=...) in arbiter/config/models.py (the reference is built from them): "
        + ", ".join(sorted(missing))
    )


def test_every_route_has_its_section() -> None:
    page = (ROOT / "docs" / "http-api.md").read_text()
    for path, item in docs.openapi_schema()["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in page, (
                f"{method.upper()} {path} is not in docs/http-api.md: run `{docs.REGENERATE}`"
            )


def test_check_fails_on_a_stale_page_and_a_run_fixes_it(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "plugins").symlink_to(ROOT / "plugins")  # which distributions are the shipped ones
    page = tmp_path / "docs" / "node-config.md"
    page.write_text(page.read_text().replace("| `tick_s` |", "| `tick_seconds` |"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "arbiter.docs", "--root", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    stale = run("--check")
    assert stale.returncode == 1
    assert "docs/node-config.md is out of date" in stale.stderr and docs.REGENERATE in stale.stderr
    assert "tick_seconds" in page.read_text()  # --check changes nothing
    assert run().returncode == 0
    assert run("--check").returncode == 0
    assert (tmp_path / "docs" / "node-config.md").read_text() == (ROOT / "docs" / "node-config.md").read_text()


def test_a_page_without_its_region_is_an_error_saying_what_to_add() -> None:
    try:
        docs.fill("# nothing here\n", "docs/x.md", "rule reference", "text")
    except docs.RegionMissing as exc:
        assert "<!-- BEGIN GENERATED: rule reference -->" in str(exc)
    else:
        raise AssertionError("a missing region went unnoticed")


def test_every_page_is_in_the_index_and_every_link_resolves() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"
    assert "docs/README.md" in (ROOT / "README.md").read_text(), "README.md should point at docs/"
