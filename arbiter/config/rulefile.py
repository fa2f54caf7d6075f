"""One rule file read as YAML and not yet validated (:class:`RuleFile`), the plugin blocks
it holds, and ``extends:``: the values of a base and its extensions merged
(:func:`merge_rule_files`), each value still knowing where it stood and in which file.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.config.errors import Problem
from arbiter.config.validation import field_path, load_yaml_mapping
from arbiter.config.yamlpos import Path_, Positions, position_of

#: where rule files hold plugin blocks, and the family each belongs to
RULE_BLOCKS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("match",), "matchers"),
    (("protect", "source"), "sources"),
    (("during", "*", "source"), "sources"),
    (("protect", "source", "match"), "matchers"),  # sources that watch processes (on_exec)
    (("during", "*", "source", "match"), "matchers"),
    (("busy",), "sources"),
    (("events",), "sources"),
    (("release",), "translators"),
    (("reacquire",), "translators"),
    (("profile",), "translators"),
)


def raw_kind_blocks(data: Any) -> list[tuple[Path_, str, dict[str, Any]]]:
    """Every plugin block in a parsed rule file, as (location, family, block)."""
    found: list[tuple[Path_, str, dict[str, Any]]] = []

    def walk(node: Any, rest: tuple[str, ...], loc: Path_, family: str) -> None:
        if not rest:
            if isinstance(node, dict):
                found.append((loc, family, node))
            return
        head, tail = rest[0], rest[1:]
        if head == "*":
            if isinstance(node, list):
                for i, item in enumerate(node):
                    walk(item, tail, (*loc, i), family)
        elif isinstance(node, dict) and head in node:
            walk(node[head], tail, (*loc, head), family)

    for path, family in RULE_BLOCKS:
        walk(data, path, (), family)
    return found


@dataclass
class RuleFile:
    """One rule file read as YAML, not yet validated: its values and where each stood."""

    path: str
    text: str
    data: dict[str, Any]
    positions: Positions

    @property
    def own_id(self) -> str | None:
        """The id this file writes itself (an extension that writes none has its base's)."""
        value = self.data.get("id")
        return value if isinstance(value, str) else None

    def problem(self, loc: Path_, message: str, hint: str = "") -> Problem:
        line, col = position_of(self.positions, loc)
        return Problem(self.path, line, col, field_path(loc), message, hint)


def read_rule_file(text: str, filename: str) -> RuleFile:
    data, positions = load_yaml_mapping(text, filename)
    return RuleFile(filename, text, data, positions)


@dataclass
class MergedRule:
    """The values of a base and its extensions merged, where each stood and in which file."""

    data: dict[str, Any]
    positions: Positions
    origins: dict[Path_, str]  # a key of positions → the file it is in


def _is_block(path: Path_) -> bool:
    """Whether a rule file holds a plugin block at ``path`` (see RULE_BLOCKS)."""
    return any(
        len(pattern) == len(path)
        and all(
            want == part or (want == "*" and isinstance(part, int)) for want, part in zip(pattern, path, strict=True)
        )
        for pattern, _family in RULE_BLOCKS
    )


def _take(layer: RuleFile, path: Path_, into: MergedRule, whole: bool) -> None:
    """Note where ``layer`` writes ``path``; ``whole``: and everything under it, forgetting
    where the value it replaces stood."""
    if whole:
        for key in [k for k in into.positions if k[: len(path)] == path]:
            del into.positions[key]
            into.origins.pop(key, None)
        taken = [k for k in layer.positions if k[: len(path)] == path]
    else:
        taken = [k for k in (path, (*path, "__key__")) if k in layer.positions]
    for key in taken:
        into.positions[key] = layer.positions[key]
        into.origins[key] = layer.path


_ABSENT = object()


def _overlay(base: Any, over: Any, path: Path_, layer: RuleFile, into: MergedRule) -> Any:
    merge = isinstance(base, dict) and isinstance(over, dict)
    if merge and _is_block(path) and "kind" in base and "kind" in over and base["kind"] != over["kind"]:
        merge = False  # one kind's options mean nothing to another: merged, they would only be "unknown field"s
    if merge:
        _take(layer, path, into, whole=False)
        out = dict(base)
        for key, value in over.items():
            out[key] = _overlay(base.get(key, _ABSENT), value, (*path, key), layer, into)
        return out
    _take(layer, path, into, whole=True)
    return copy.deepcopy(over)  # never shared with a file's own values


def merge_rule_files(layers: Sequence[RuleFile]) -> MergedRule:
    """The base's values (``layers[0]``) deep-merged with each extension's in turn: mappings
    merge key by key, anything else (a list, a value, null, a plugin block of another kind)
    replaces what the layer below wrote."""
    merged = MergedRule({}, {}, {})
    for layer in layers:
        merged.data = _overlay(merged.data, layer.data, (), layer, merged)
    return merged


def with_base_url(data: dict[str, Any]) -> dict[str, Any]:
    """The rule with each plugin block's ``url`` that is a path (``/metrics``) joined to the
    rule's ``base_url``, so that a program on another port is one line of an extension; so is
    the ``url`` of each mapping in a list the block holds (the steps a release sends around its
    own request)."""
    base = data.get("base_url")
    if not isinstance(base, str) or not base:
        return data
    out = copy.deepcopy(data)
    for _, _, block in raw_kind_blocks(out):
        listed = [item for value in block.values() if isinstance(value, list) for item in value]
        for holder in (block, *(item for item in listed if isinstance(item, dict))):
            url = holder.get("url")
            if isinstance(url, str) and url.startswith("/"):
                holder["url"] = base.rstrip("/") + url
    return out
