"""Reading and validating arbiter's files, with errors that point at a line.

Rule files validate in two stages: the outer :class:`Rule` model, then every
``{kind: ...}`` block against the options model of the plugin that registered the kind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from arbiter.config.errors import ConfigError, Problem
from arbiter.config.locate import find_config, relative_to_config
from arbiter.config.models import KindBlock, Manifest, NodeConfig, Rule
from arbiter.config.safety import command_file_problem
from arbiter.config.yamlpos import Path_, Positions, load_with_positions, position_of

M = TypeVar("M", bound=BaseModel)

#: (family, kind) → the kind's options model, or None when no plugin registers it
OptionsLookup = Callable[[str, str], "type[BaseModel] | None"]
#: family → the kinds it has, for hints
KindsLookup = Callable[[str], "list[str]"]

RULE_SUFFIXES = (".yaml", ".yml")

_HINTS = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": "add it",
    "float_parsing": "write a number",
    "int_parsing": "write a whole number",
    "bool_parsing": "write true or false",
    "string_type": "write text (quote it if it looks like a number)",
    "list_type": "write a list, e.g. [a, b]",
    "dict_type": "write a mapping of key: value lines",
    "model_type": "write a mapping of key: value lines",
    "literal_error": "use one of the values listed",
    "string_pattern_mismatch": "use letters, digits, '.', '_' and '-', starting with a letter or digit",
}


def _field_path(loc: Iterable[str | int]) -> str:
    return ".".join(str(part) for part in loc)


def problems_from(exc: ValidationError, filename: str, positions: Positions, prefix: Path_ = ()) -> list[Problem]:
    out = []
    for err in exc.errors(include_url=False):
        loc: Path_ = (*prefix, *[p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))])
        # unions report each alternative under a type tag; it means nothing to a user
        loc = tuple(p for p in loc if p not in ("str", "KindBlock", "list[str]"))
        line, col = position_of(positions, loc, prefer_key=err["type"] == "extra_forbidden")
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        out.append(Problem(filename, line, col, _field_path(loc), message, _HINTS.get(err["type"], "")))
    return sorted(out, key=lambda p: (p.line, p.column))


def validate(model: type[M], data: Any, filename: str, positions: Positions, prefix: Path_ = ()) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from(exc, filename, positions, prefix)) from None


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError([Problem(str(path), 0, 0, "", "not UTF-8 text", "save the file as UTF-8")]) from None
    except OSError as exc:
        raise ConfigError([Problem(str(path), 0, 0, "", f"cannot read: {exc.strerror or exc}")]) from None


def load_yaml_mapping(text: str, filename: str) -> tuple[dict[str, Any], Positions]:
    data, positions = load_with_positions(text, filename)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([Problem(filename, 1, 1, "", "expected a mapping of key: value lines at the top")])
    return data, positions


# --- node config -----------------------------------------------------------------------------


def parse_node_config(text: str, filename: str) -> NodeConfig:
    data, positions = load_yaml_mapping(text, filename)
    return validate(NodeConfig, data, filename, positions)


def load_node_config(explicit: str | os.PathLike[str] | None = None) -> tuple[NodeConfig, Path | None]:
    """The node config and where it came from (``None``: built-in defaults)."""
    path = find_config(explicit)
    if path is None:
        return NodeConfig(), None
    if not path.is_file():
        raise ConfigError([Problem(str(path), 0, 0, "", "no such config file", "check --config or $ARBITER_CONFIG")])
    return resolve_paths(parse_node_config(read_text(path), str(path)), path), path


def resolve_paths(config: NodeConfig, path: Path) -> NodeConfig:
    """Relative paths in a config file mean relative to that file."""
    config.state_dir = str(relative_to_config(config.state_dir, path))
    config.tenants_dirs = [str(relative_to_config(d, path)) for d in config.tenants_dirs]
    return config


# --- rule files ------------------------------------------------------------------------------


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
    (("profile",), "translators"),
    (("throttle",), "translators"),
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


#: why a file may not hold a rule that runs a command (None: it may)
CommandCheck = Callable[[str], "str | None"]

COMMAND_FILE_HINT = (
    "make the file and every folder above it owned by root (or the daemon's user) and not writable by "
    "group or others (chown root FILE; chmod go-w FILE and its folders); no symbolic link, one hard link"
)


def parse_rule(
    text: str, filename: str, options_for: OptionsLookup, kinds: KindsLookup, command_check: CommandCheck | None = None
) -> Rule:
    """Validate one rule file in both stages; raises ConfigError listing every problem.

    Stage two runs even when stage one fails, so one pass reports everything.  A kind
    whose options declare ``runs_command`` is refused unless ``command_check`` (by default
    the real file's ownership and modes) finds the file safe.
    """
    command_check = command_check or command_file_problem
    data, positions = load_yaml_mapping(text, filename)
    problems: list[Problem] = []
    rule: Rule | None = None
    try:
        rule = validate(Rule, data, filename, positions)
    except ConfigError as exc:
        problems.extend(exc.problems)
    for loc, family, raw in raw_kind_blocks(data):
        kind = raw.get("kind", "process" if family == "matchers" else None)
        field_path = _field_path(loc)
        if not isinstance(kind, str):
            continue  # stage one reports a missing or odd kind
        model = options_for(family, kind)
        if model is None:
            line, col = position_of(positions, (*loc, "kind"))
            known = ", ".join(sorted(kinds(family))) or "none installed"
            problems.append(Problem(filename, line, col, f"{field_path}.kind", f"unknown {family[:-1]} kind {kind!r}", f"known: {known}"))
            continue
        try:
            validate_kind_options(KindBlock(**{**raw, "kind": kind}), model)
        except ValidationError as exc:
            problems.extend(problems_from(exc, filename, positions, loc))
        if getattr(model, "runs_command", False):
            unsafe = command_check(filename)
            if unsafe:
                line, col = position_of(positions, (*loc, "kind"))
                problems.append(Problem(filename, line, col, f"{field_path}.kind",
                                        f"kind {kind!r} runs a command, and this file is not safe to take one from: {unsafe}",
                                        COMMAND_FILE_HINT))
    if problems or rule is None:
        raise ConfigError(sorted(problems, key=lambda p: (p.line, p.column)))
    return rule


def validate_kind_options(block: KindBlock, model: type[BaseModel]) -> BaseModel:
    """Stage two: a block's options against its kind's model (which may declare ``kind`` too)."""
    options = block.options()
    if "kind" in model.model_fields:
        options["kind"] = block.kind
    return model.model_validate(options)


def rule_files(directories: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for directory in directories:
        if directory.is_file():
            files.append(directory)
        elif directory.is_dir():
            files.extend(sorted(p for p in directory.iterdir() if p.suffix in RULE_SUFFIXES and not p.name.startswith(".")))
    return files


@dataclass
class RuleSet:
    """The rules of a set of files, and every problem found reading them."""

    rules: dict[str, Rule] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # rule id → file it came from
    problems: dict[str, list[Problem]] = field(default_factory=dict)  # file → problems

    def add(self, path: str, rule: Rule, positions_line: int = 1) -> None:
        if rule.id in self.rules:
            other = self.files[rule.id]
            self.problems.setdefault(path, []).append(
                Problem(path, positions_line, 1, "id", f"rule id {rule.id!r} is already used by {other}", "give each rule its own id")
            )
            return
        self.rules[rule.id] = rule
        self.files[rule.id] = path


def check_paths(paths: Iterable[Path], options_for: OptionsLookup, kinds: KindsLookup) -> RuleSet:
    """Read every rule file under ``paths`` (files or directories) and collect all problems."""
    ruleset = RuleSet()
    for path in rule_files(paths):
        try:
            rule = parse_rule(read_text(path), str(path), options_for, kinds)
        except ConfigError as exc:
            ruleset.problems.setdefault(str(path), []).extend(exc.problems)
            continue
        ruleset.add(str(path), rule)
    return ruleset


# --- manifests -------------------------------------------------------------------------------


def parse_manifest(text: str, filename: str) -> Manifest:
    data, positions = load_yaml_mapping(text, filename)
    return validate(Manifest, data, filename, positions)
