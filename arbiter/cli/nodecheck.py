"""What the node config asks of the installed plugins: each reader and translator it names is
installed, takes the options given and may act here, and each top-level key that is not
arbiter's own is the section of an enabled plugin and holds what its model takes.

``arbiter check``, ``arbiter doctor`` and ``arbiter run`` all judge the node config by
:func:`node_problems`, so a config one of them accepts none of the others refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from arbiter.config.errors import ConfigError, Problem, did_you_mean
from arbiter.config.models import KindBlock, NodeConfig
from arbiter.config.sections import judge_sections
from arbiter.config.validation import load_yaml_mapping, problems_from, read_text
from arbiter.config.yamlpos import Path_, Positions, anchor_of

if TYPE_CHECKING:
    from arbiter.pluginmanager import PluginHost


def _positions(path: Path | None) -> Positions:
    if path is None:
        return {}
    try:
        return load_yaml_mapping(read_text(path), str(path))[1]
    except ConfigError:
        return {}  # the file's own problems are reported where it is parsed


def node_problems(cfg: NodeConfig, path: Path | None, host: PluginHost) -> list[Problem]:
    """Every kind the node config names that the installed plugins cannot serve, at its line."""
    where = str(path or "arbiter.yaml")
    positions = _positions(path)
    problems: list[Problem] = []

    def add(loc: Path_, message: str, hint: str) -> None:
        line, col = positions.get(anchor_of(positions, loc), (0, 0))
        problems.append(Problem(where, line, col, ".".join(map(str, loc)), message, hint))

    for i, entry in enumerate(cfg.readers):
        block = KindBlock(kind=entry) if isinstance(entry, str) else entry
        loc: Path_ = ("readers", i) if isinstance(entry, str) else ("readers", i, "kind")
        info = host.kind("readers", block.kind)
        if info is None:
            add(
                loc,
                f"unknown reader kind {block.kind!r}",
                did_you_mean(block.kind, host.kind_names("readers"), "known reader kinds"),
            )
            continue
        if info.cls.stand_in and not cfg.stand_in_gpu:
            add(
                loc,
                f"{block.kind} is a stand-in for a GPU reader (it measures something else)",
                "set stand_in_gpu: true (demos and tests only) or remove it",
            )
            continue
        try:
            info.cls.Options.model_validate(block.options())
        except ValidationError as exc:
            problems.extend(problems_from(exc, where, positions, ("readers", i), model=info.cls.Options))
    problems.extend(judge_sections(cfg, where, positions, host.section_models(), host.blocked)[1])
    for need, names in cfg.translators.items():
        for j, name in enumerate(names):
            made = host.kind("translators", name)
            if made is None:
                add(
                    ("translators", need, j),
                    f"unknown translator kind {name!r}",
                    did_you_mean(name, host.kind_names("translators"), "known translator kinds"),
                )
            elif need not in made.cls.actions:
                able = [n for n in host.kind_names("translators") if need in host.kinds["translators"][n].cls.actions]
                add(
                    ("translators", need, j),
                    f"translator {name!r} cannot {need}",
                    f"those that can: {', '.join(able) or 'none installed'}",
                )
    return sorted(problems, key=lambda p: (p.line, p.column))
