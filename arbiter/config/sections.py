"""The node config's plugin sections: each top-level key that is not arbiter's own is the
section of an enabled plugin (``arbiter_register_node_sections``) and holds what its model
takes; anything else is an unknown key, reported with arbiter's keys and the sections."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from arbiter.config.errors import ConfigError, Problem, did_you_mean
from arbiter.config.models import NodeConfig
from arbiter.config.validation import problems_from
from arbiter.config.yamlpos import Positions, anchor_of
from arbiter.plugin import KindOptions


def plugin_sections(
    cfg: NodeConfig, declared: Mapping[str, type[KindOptions]], blocked: Collection[str] = ()
) -> dict[str, KindOptions]:
    """The sections, validated, by name (what :attr:`arbiter.plugin.PluginContext.sections`
    holds); a section the config leaves out has its model's defaults (none where the model
    needs a value).  Raises :class:`ConfigError` with the problems that
    :func:`judge_sections` finds (``arbiter check`` gives them with their lines)."""
    options, problems = judge_sections(cfg, "arbiter.yaml", {}, declared, blocked)
    if problems:
        raise ConfigError(problems)
    return options


def judge_sections(
    cfg: NodeConfig,
    where: str,
    positions: Positions,
    declared: Mapping[str, type[KindOptions]],
    blocked: Collection[str] = (),
) -> tuple[dict[str, KindOptions], list[Problem]]:
    """The sections validated, and every problem with them at its line."""
    given = cfg.sections()
    options: dict[str, KindOptions] = {}
    problems: list[Problem] = []
    for name, model in sorted(declared.items()):
        raw: Any = given.get(name)
        try:
            options[name] = model.model_validate({} if raw is None else raw) if name in given else model()
        except ValidationError as exc:
            if name in given:
                problems.extend(problems_from(exc, where, positions, (name,), model=model))
    for name in sorted(set(given) - set(declared)):
        line, col = positions.get(anchor_of(positions, (name,), prefer_key=True), (0, 0))
        hint = _unknown_hint(name, sorted(declared), sorted(blocked))
        problems.append(Problem(where, line, col, name, f"unknown key {name!r}", hint))
    return options, problems


def _unknown_hint(name: str, sections: list[str], blocked: list[str]) -> str:
    """The keys arbiter takes and the sections of the enabled plugins, the closest first."""
    keys = sorted(NodeConfig.model_fields)
    close = did_you_mean(name, [*keys, *sections])
    hint = close.split("? ", 1)[0] + "? " if close.startswith("did you mean") else ""
    hint += f"known keys: {', '.join(keys)}; sections of the enabled plugins: {', '.join(sections) or 'none'}"
    if blocked:
        hint += f"; disabled plugins (disable_plugins): {', '.join(blocked)}"
    return hint + "; a plugin's section needs the plugin that reads it installed and enabled"
