"""YAML loading that remembers where each value stood, so errors can name a line."""

from __future__ import annotations

from typing import Any

import yaml

from arbiter.config.errors import ConfigError, Problem

Path_ = tuple[str | int, ...]
Positions = dict[Path_, tuple[int, int]]


def _construct(node: yaml.Node, path: Path_, positions: Positions, loader: yaml.SafeLoader) -> Any:
    positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ConfigError(
                    [Problem("", key_node.start_mark.line + 1, key_node.start_mark.column + 1, "", "a key must be a plain value")]
                )
            child = (*path, str(key))
            # the key's own position helps for "unknown field" errors
            positions[(*child, "__key__")] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[str(key)] = _construct(value_node, child, positions, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), positions, loader) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_with_positions(text: str, filename: str) -> tuple[Any, Positions]:
    """Parse one YAML document; returns its value and the (line, column) of every path."""
    positions: Positions = {}
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = None if node is None else _construct(node, (), positions, loader)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ConfigError([Problem(filename, line, col, "", f"not valid YAML: {message}", "check indentation and quoting")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(filename, 0, 0, "", f"not valid YAML: {exc}")]) from None
    except ConfigError as exc:
        raise ConfigError([Problem(filename, p.line, p.column, p.field, p.message, p.hint) for p in exc.problems]) from None
    return data, positions


def position_of(positions: Positions, loc: Path_, prefer_key: bool = False) -> tuple[int, int]:
    """The position of ``loc`` or of its nearest ancestor that appears in the file."""
    if prefer_key and (*loc, "__key__") in positions:
        return positions[(*loc, "__key__")]
    path = tuple(loc)
    while path:
        if path in positions:
            return positions[path]
        path = path[:-1]
    return positions.get((), (1, 1))
