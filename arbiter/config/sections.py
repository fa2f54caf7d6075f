"""The node config's plugin sections: each top-level key that is not arbiter's own is the
section of an enabled plugin (``arbiter_register_node_sections``) and holds what its model
takes; anything else is an unknown key, reported with arbiter's keys and the sections."""

from __future__ import annotations

import contextlib
import difflib
import logging
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from arbiter.config.errors import Problem, did_you_mean
from arbiter.config.models import NodeConfig
from arbiter.config.validation import problems_from
from arbiter.config.yamlpos import Positions, anchor_of
from arbiter.plugin import KindOptions

log = logging.getLogger(__name__)

#: how close a key must be to one of arbiter's to be taken for it misspelt (0.8: one letter in ten)
MISSPELT = 0.8


def plugin_sections(
    cfg: NodeConfig, declared: Mapping[str, type[KindOptions]], blocked: Collection[str] = ()
) -> dict[str, KindOptions]:
    """The sections, validated, by name (what :attr:`arbiter.plugin.PluginContext.sections`
    holds); a section the config leaves out has its model's defaults (none where the model
    needs a value).  It never refuses: the daemon does not start on a config with a problem
    in a section (:func:`judge_sections` finds them for it and for ``arbiter check``), and
    what still runs on such a config (``arbiter resume-all`` after a crash) must go on: a
    section with a problem counts as left out, and the log says so."""
    options, problems = judge_sections(cfg, "the node config", {}, declared, blocked)
    for problem in problems:
        log.warning("%s: read as if the section were left out (`arbiter check` gives its line)", problem)
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
                with contextlib.suppress(ValidationError):
                    options[name] = model()
    for name in sorted(set(given) - set(declared)):
        line, col = positions.get(anchor_of(positions, (name,), prefer_key=True), (0, 0))
        hint = _unknown_hint(name, sorted(declared), sorted(blocked))
        problems.append(Problem(where, line, col, name, f"unknown key {name!r}", hint))
    return options, problems


def misspelt_keys(cfg: NodeConfig, where: str, positions: Positions) -> list[Problem]:
    """The top-level keys that are not arbiter's but so close to one of its keys that they are
    that key misspelt: judged wherever the config is read, without the plugins (whose sections
    only :func:`judge_sections`, with them loaded, tells from unknown keys)."""
    problems = []
    for name in sorted(cfg.sections()):
        key = misspelling_of(name)
        if key is not None:
            line, col = positions.get(anchor_of(positions, (name,), prefer_key=True), (0, 0))
            problems.append(Problem(where, line, col, name, f"unknown key {name!r}", f"did you mean {key!r}?"))
    return problems


def misspelling_of(name: str) -> str | None:
    """The key of arbiter's own that ``name`` is, or is so close to that it would be taken for
    it misspelt; None for a name no key is near (a plugin's section may have it)."""
    close = difflib.get_close_matches(name, sorted(NodeConfig.model_fields), n=1, cutoff=MISSPELT)
    return close[0] if close else None


def _unknown_hint(name: str, sections: list[str], blocked: list[str]) -> str:
    """The keys arbiter takes and the sections of the enabled plugins, the closest first."""
    keys = sorted(NodeConfig.model_fields)
    close = did_you_mean(name, [*keys, *sections])
    hint = close.split("? ", 1)[0] + "? " if close.startswith("did you mean") else ""
    hint += f"known keys: {', '.join(keys)}; sections of the enabled plugins: {', '.join(sections) or 'none'}"
    if blocked:
        hint += f"; disabled plugins (disable_plugins): {', '.join(blocked)}"
    return hint + "; a plugin's section needs the plugin that reads it installed and enabled"
