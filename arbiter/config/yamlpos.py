"""YAML loading that remembers where each value stood, so errors can name a line."""

from __future__ import annotations

import re
from typing import Any

import yaml

from arbiter.config.errors import ConfigError, Problem

Path_ = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true and false.  YAML 1.1 would also read on, off, yes and
    no as booleans, and `on: [uploading]` is how a phase source is written."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
Positions = dict[Path_, tuple[int, int]]


#: values a file may expand to through aliases; past it a few lines of anchors could make
#: the loader (and the daemon reloading it) build billions of values
MAX_VALUES = 100_000


def _problem_at(node: yaml.Node, message: str, hint: str = "") -> ConfigError:
    return ConfigError([Problem("", node.start_mark.line + 1, node.start_mark.column + 1, "", message, hint)])


def _construct(node: yaml.Node, path: Path_, positions: Positions, loader: _Loader, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _problem_at(
            node,
            f"the file expands to more than {MAX_VALUES} values (aliases of aliases?)",
            "write the values out instead of nesting aliases",
        )
    positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, _value in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise _problem_at(
                        key_node,
                        f"{key_node.value!r} is written twice in this mapping",
                        "keep one of them: only the last would count",
                    )
                seen.add(key_node.value)
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise _problem_at(key_node, "a key must be a plain value")
            key = key_node.value
            child = (*path, key)
            # the key's own position helps for "unknown field" errors
            positions[(*child, "__key__")] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            out[key] = _construct(value_node, child, positions, loader, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), positions, loader, budget) for i, item in enumerate(node.value)]
    try:
        return loader.construct_object(node, deep=True)
    except (ValueError, OverflowError) as exc:
        # PyYAML lets these through: an integer too long to convert, a date like 2024-13-45
        raise _problem_at(node, f"cannot read this value: {exc}", "quote it to write text") from None


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def load_with_positions(text: str, filename: str) -> tuple[Any, Positions]:
    """Parse one YAML document; returns its value and the (line, column) of every path."""
    positions: Positions = {}
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            data = None if node is None else _construct(node, (), positions, loader, [MAX_VALUES])
        except RecursionError:
            # PyYAML composes nested values recursively; where it stood is where the nesting went too deep
            mark = loader.get_mark()
            raise ConfigError(
                [
                    Problem(
                        filename,
                        mark.line + 1,
                        mark.column + 1,
                        "",
                        "nested too deeply",
                        "flatten the nesting: no arbiter file needs more than a few levels",
                    )
                ]
            ) from None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        where = exc.problem_mark or exc.context_mark
        line, col = (where.line + 1, where.column + 1) if where else (0, 0)
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ConfigError(
            [Problem(filename, line, col, "", f"not valid YAML: {message}", "check indentation and quoting")]
        ) from None
    except yaml.reader.ReaderError as exc:
        # a character YAML does not allow (a control character, NUL); its position is an offset
        line, col = _line_col(text, exc.position) if isinstance(exc.name, str) and exc.name.startswith("<") else (0, 0)
        code = exc.character if isinstance(exc.character, int) else 0
        escape = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
        raise ConfigError(
            [
                Problem(
                    filename,
                    line,
                    col,
                    "",
                    f"not valid YAML: the character #x{code:04x} is not allowed",
                    f"remove it, or write it as {escape} inside double quotes",
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(filename, 0, 0, "", f"not valid YAML: {exc}")]) from None
    except ConfigError as exc:
        raise ConfigError(
            [Problem(filename, p.line, p.column, p.field, p.message, p.hint) for p in exc.problems]
        ) from None
    return data, positions


def anchor_of(positions: Positions, loc: Path_, prefer_key: bool = False) -> Path_:
    """The key of ``positions`` that stands for ``loc``: its key's own position (when asked
    and known), else ``loc`` or its nearest ancestor that appears in the file, else ``()``."""
    if prefer_key and (*loc, "__key__") in positions:
        return (*loc, "__key__")
    path = tuple(loc)
    while path:
        if path in positions:
            return path
        path = path[:-1]
    return ()


def position_of(positions: Positions, loc: Path_, prefer_key: bool = False) -> tuple[int, int]:
    """The position of ``loc`` or of its nearest ancestor that appears in the file."""
    return positions.get(anchor_of(positions, loc, prefer_key), (1, 1))
