"""Reading and validating arbiter's files, with errors that point at a line.

Rule files validate in two stages: the outer :class:`Rule` model, then every
``{kind: ...}`` block against the options model of the plugin that registered the kind.

It is over 400 lines because reading, validating and following ``extends:`` share the
positions of every value: split apart, each would pass them back and forth.
"""

from __future__ import annotations

import copy
import os
import stat
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from arbiter.config.errors import ConfigError, Problem, did_you_mean
from arbiter.config.locate import find_config, relative_to_config, shipped_tenants_dir
from arbiter.config.models import KindBlock, Manifest, NodeConfig, Rule
from arbiter.config.safety import command_file_problem
from arbiter.config.yamlpos import Path_, Positions, anchor_of, load_with_positions, position_of
from arbiter.plugin import KindOptions

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


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, or inside Optional, a union, a list or a dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def known_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys a model takes at ``loc`` (the mapping that holds the last part of it)."""
    models = [model]
    for part in loc[:-1]:
        inner = [
            m
            for current in models
            for name, info in current.model_fields.items()
            if part in (name, info.alias)
            for m in _models_in(info.annotation)
        ]
        if inner:
            models = inner  # a field; else a list index or a mapping's key: the same models hold
    return sorted({info.alias or name for m in models for name, info in m.model_fields.items()})


def problems_from(
    exc: ValidationError,
    filename: str,
    positions: Positions,
    prefix: Path_ = (),
    origins: Mapping[Path_, str] | None = None,
    model: type[BaseModel] | None = None,
) -> list[Problem]:
    """Each validation error as a Problem at its line.  ``origins`` (a position's key → the
    file it is in) is for a rule merged from several files: each problem then names the file
    that holds the value, so the user edits the right one.  With the ``model`` validated, a key
    it does not take gets the keys it does take, the closest first."""
    out = []
    for err in exc.errors(include_url=False):
        own = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # unions report each alternative under a type tag; it means nothing to a user
        own = tuple(p for p in own if p not in ("str", "KindBlock", "list[str]"))
        loc: Path_ = (*prefix, *own)
        anchor = anchor_of(positions, loc, prefer_key=err["type"] == "extra_forbidden")
        line, col = positions.get(anchor, (1, 1))
        where = origins.get(anchor, filename) if origins else filename
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        hint = _HINTS.get(err["type"], "")
        if err["type"] == "extra_forbidden" and model is not None and own:
            keys = [k for k in known_keys(model, own) if k != "kind"]
            message = f"unknown key {own[-1]!r}"
            hint = did_you_mean(str(own[-1]), keys, "known keys here") if keys else "it takes no options: remove it"
            if keys and not hint.startswith("did you mean"):
                hint = f"remove it; {hint}"
        out.append(Problem(where, line, col, _field_path(loc), message, hint))
    return sorted(out, key=lambda p: (p.line, p.column))


def validate(
    model: type[M],
    data: Any,
    filename: str,
    positions: Positions,
    prefix: Path_ = (),
    origins: Mapping[Path_, str] | None = None,
) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from(exc, filename, positions, prefix, origins, model)) from None


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        before = exc.object[: exc.start]
        line, col = before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1
        raise ConfigError(
            [
                Problem(
                    str(path),
                    line,
                    col,
                    "",
                    f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})",
                    "save the file as UTF-8",
                )
            ]
        ) from None
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

    def resolved(value: str, field_path: str) -> str:
        try:
            return str(relative_to_config(value, path))
        except RuntimeError:  # ~name of a user this host does not know
            raise ConfigError(
                [
                    Problem(
                        str(path),
                        0,
                        0,
                        field_path,
                        f"{value!r} starts with ~ but names no user of this host",
                        "write an absolute path, or ~/ for the daemon's own home",
                    )
                ]
            ) from None

    config.state_dir = resolved(config.state_dir, "state_dir")
    config.tenants_dirs = [resolved(d, f"tenants_dirs.{i}") for i, d in enumerate(config.tenants_dirs)]
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


#: why a file may not hold a rule that runs a command (None: it may)
CommandCheck = Callable[[str], "str | None"]

COMMAND_FILE_HINT = (
    "make the file and every folder above it owned by root (or the daemon's user) and not writable by "
    "group or others (chown root FILE; chmod go-w FILE and its folders); no symbolic link"
)


def parse_rule(
    text: str, filename: str, options_for: OptionsLookup, kinds: KindsLookup, command_check: CommandCheck | None = None
) -> Rule:
    """Validate one rule file by itself in both stages; raises ConfigError listing every problem.

    Stage two runs even when stage one fails, so one pass reports everything.  A kind
    whose options declare ``runs_command`` is refused unless ``command_check`` (by default
    the real file's ownership and modes) finds the file safe.  ``extends:`` needs the other
    rule files, so it is followed by :func:`resolve_rules`, not here.
    """
    return _validate_rule([read_rule_file(text, filename)], options_for, kinds, command_check or command_file_problem)


def validate_kind_options(block: KindBlock, model: type[M]) -> M:
    """Stage two: a block's options against its kind's model (which may declare ``kind`` too)."""
    options = block.options()
    if "kind" in model.model_fields:
        options["kind"] = block.kind
    return model.model_validate(options)


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
        return Problem(self.path, line, col, _field_path(loc), message, hint)


def read_rule_file(text: str, filename: str) -> RuleFile:
    data, positions = load_yaml_mapping(text, filename)
    return RuleFile(filename, text, data, positions)


# --- extends: a rule file built on another ----------------------------------------------------


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
    rule's ``base_url``, so that a program on another port is one line of an extension."""
    base = data.get("base_url")
    if not isinstance(base, str) or not base:
        return data
    out = copy.deepcopy(data)
    for _, _, block in raw_kind_blocks(out):
        url = block.get("url")
        if isinstance(url, str) and url.startswith("/"):
            block["url"] = base.rstrip("/") + url
    return out


def _validate_rule(
    layers: Sequence[RuleFile], options_for: OptionsLookup, kinds: KindsLookup, command_check: CommandCheck
) -> Rule:
    """Both stages over the rule ``layers`` make: one file, or a base and its extensions (base
    first).  Each problem names the file that holds the value; what is missing, the top one."""
    top = layers[-1]
    origins: dict[Path_, str] | None = None
    if len(layers) == 1:
        data, positions = top.data, top.positions
    else:
        merged = merge_rule_files(layers)
        data, positions, origins = merged.data, merged.positions, merged.origins
    data = with_base_url(data)

    def where(loc: Path_) -> tuple[str, int, int]:
        anchor = anchor_of(positions, loc)
        line, col = positions.get(anchor, (1, 1))
        return (origins or {}).get(anchor, top.path), line, col

    problems: list[Problem] = []
    rule: Rule | None = None
    try:
        rule = validate(Rule, data, top.path, positions, origins=origins)
    except ConfigError as exc:
        problems.extend(exc.problems)
    for loc, family, raw in raw_kind_blocks(data):
        kind = raw.get("kind", "process" if family == "matchers" else None)
        field_path = _field_path(loc)
        if not isinstance(kind, str):
            continue  # stage one reports a missing or odd kind
        model = options_for(family, kind)
        if model is None:
            file, line, col = where((*loc, "kind"))
            problems.append(
                Problem(
                    file,
                    line,
                    col,
                    f"{field_path}.kind",
                    f"unknown {family[:-1]} kind {kind!r}",
                    did_you_mean(kind, kinds(family), f"known {family[:-1]} kinds"),
                )
            )
            continue
        needs = "runs a command" if getattr(model, "runs_command", False) else None
        try:
            options = validate_kind_options(KindBlock(**{**raw, "kind": kind}), model)
        except ValidationError as exc:
            problems.extend(problems_from(exc, top.path, positions, loc, origins, model))
        else:
            if isinstance(options, KindOptions):
                needs = options.needs_trusted_file()
            if loc[0] == "during" and getattr(options, "gives_phase", lambda: None)() is False:
                file, line, col = where(loc)
                problems.append(
                    Problem(
                        file,
                        line,
                        col,
                        field_path,
                        f"a {kind} source with these options gives no phase (on, off, soon), which during: needs",
                        "give it the options of a phase (docs/rule-files.md lists each kind's), or move it to "
                        "protect.source, which takes a rate",
                    )
                )
        if needs:
            # every file the rule is made of is trusted with it, not only the one naming the kind
            for layer in layers:
                unsafe = command_check(layer.path)
                if unsafe:
                    line, col = position_of(layer.positions, (*loc, "kind"))
                    problems.append(
                        Problem(
                            layer.path,
                            line,
                            col,
                            f"{field_path}.kind",
                            f"kind {kind!r} {needs}, and this file is not safe to take that from: {unsafe}",
                            COMMAND_FILE_HINT,
                        )
                    )
    if problems or rule is None:
        raise ConfigError(_in_order(problems, [layer.path for layer in layers]))
    return rule


def _in_order(problems: Iterable[Problem], files: Sequence[str]) -> list[Problem]:
    """Base first, then each extension; by line within a file."""
    rank = {f: i for i, f in enumerate(files)}
    return sorted(problems, key=lambda p: (rank.get(p.file, len(rank)), p.line, p.column))


@dataclass
class Resolution:
    """What a set of rule files defines once every ``extends:`` is followed.

    Each file is the *top* of a chain (no other file extends it: the chain's rule, or its
    problems, are filed under it) or a base that a top's rule replaces (``extended``).
    """

    rules: dict[str, Rule] = field(default_factory=dict)  # top file → its rule (an extension's: the merged one)
    problems: dict[str, list[Problem]] = field(
        default_factory=dict
    )  # top file → why it has no rule; each names its file
    chains: dict[str, list[str]] = field(default_factory=dict)  # top file → every file its rule is made of, base first
    extended: dict[str, str] = field(default_factory=dict)  # base file → the top file whose rule stands in its place


def resolve_rules(
    files: Mapping[str, str | list[Problem]],
    options_for: OptionsLookup,
    kinds: KindsLookup,
    command_check: CommandCheck | None = None,
) -> Resolution:
    """Validate a set of rule files together, following ``extends:``.

    ``files`` maps each path, in reading order, to its text or to the problems met reading
    it.  ``extends: ID`` names the one other file that writes ``id: ID``.  The rule is that
    base's values deep-merged with the extension's (:func:`merge_rule_files`), validated as a
    whole; it stands in place of the base, which no longer loads by itself.  An extension may
    be extended in turn.  An id no other file writes (or more than one does), a base extended
    twice and a cycle are problems at the extension's ``extends`` line.
    """
    command_check = command_check or command_file_problem
    out = Resolution()
    parsed: dict[str, RuleFile] = {}
    for path, text in files.items():
        try:
            if isinstance(text, list):
                raise ConfigError(text)
            parsed[path] = read_rule_file(text, path)
        except ConfigError as exc:
            out.problems[path] = list(exc.problems)
            out.chains[path] = [path]
    unreadable = [p for p in files if p not in parsed]

    writers: dict[str, list[str]] = {}  # id → the files that write it themselves
    for path, rf in parsed.items():
        if rf.own_id is not None:
            writers.setdefault(rf.own_id, []).append(path)

    base_of: dict[str, str] = {}  # extension file → its base file
    link_problems: dict[str, list[Problem]] = {}

    def fail(path: str, message: str, hint: str) -> None:
        link_problems.setdefault(path, []).append(parsed[path].problem(("extends",), message, hint))

    for path, rf in parsed.items():
        name = rf.data.get("extends")
        if name is None:
            continue
        if not isinstance(name, str) or not name:
            fail(
                path,
                f"must name one rule by its id, not {type(name).__name__} {name!r}",
                "write extends: ID, where ID is the id: of the rule file this one builds on",
            )
            continue
        bases = [p for p in writers.get(name, []) if p != path]
        if len(bases) == 1:
            base_of[path] = bases[0]
        elif bases:
            fail(
                path,
                f"more than one rule file has id {name!r}: {', '.join(bases)}",
                "give each rule its own id, so that extends names one",
            )
        else:
            known = sorted({i for i, ps in writers.items() if any(p != path for p in ps)})
            hint = did_you_mean(name, known, "known ids") if known else "no other rule file has an id"
            if unreadable:
                hint += f"; these files could not be read and may hold it: {', '.join(unreadable)}"
            fail(
                path,
                f"no other rule file in the tenants dirs has id {name!r}",
                f"{hint}; the base must be a rule file in one of the tenants_dirs, or one shipped with arbiter",
            )

    # A base extended twice: which one's changes win would depend on file names, so neither does.
    twice: dict[str, list[str]] = {}
    for ext, base in base_of.items():
        twice.setdefault(base, []).append(ext)
    twice = {base: exts for base, exts in twice.items() if len(exts) > 1}
    for base, exts in twice.items():
        for ext in exts:
            others = ", ".join(e for e in exts if e != ext)
            fail(
                ext,
                f"{parsed[base].own_id!r} ({base}) is extended by {others} too",
                "a rule can be extended once: put these changes in one file, or give one of them its own id: "
                "and extend that from the other",
            )
            del base_of[ext]

    in_cycle: dict[str, list[str]] = {}
    for start in list(base_of):
        if start not in base_of:
            continue  # its cycle was found from another of its files
        seen = [start]
        cur = base_of.get(start)
        while cur is not None and cur not in seen:
            seen.append(cur)
            cur = base_of.get(cur)
        if cur is None:
            continue
        cycle = seen[seen.index(cur) :]
        shown = " → ".join(f"{Path(p).name} (id {parsed[p].own_id})" for p in [*cycle, cycle[0]])
        for member in cycle:
            in_cycle[member] = cycle
            fail(
                member,
                f"{parsed[member].data['extends']!r} leads back to this file, a cycle: {shown}",
                "a chain of extends must end at a rule file without extends: remove extends from one of these",
            )
        for member in cycle:
            del base_of[member]

    def below(path: str) -> list[str]:
        chain = [path]
        while chain[0] in base_of:
            chain.insert(0, base_of[chain[0]])
        return chain

    targets = set(base_of.values()) | set(twice)
    for path in parsed:
        if path in targets:
            continue
        chain = below(path)
        doubled = next((b for b, exts in twice.items() if path in exts), None)  # the base it shares
        members = [*below(doubled), *chain] if doubled is not None else list(chain)
        for member in members:
            if member != path:
                out.extended.setdefault(member, path)
        found = [p for m in members for p in link_problems.get(m, [])]
        # the other files of its cycle fail with it (each reports its own extends line)
        out.chains[path] = members + [m for m in in_cycle.get(path, []) if m not in members]
        if found:
            out.problems[path] = _in_order(found, members)
            continue
        try:
            out.rules[path] = _validate_rule([parsed[p] for p in chain], options_for, kinds, command_check)
        except ConfigError as exc:
            out.problems[path] = exc.problems
    return out


def rule_files(directories: Iterable[Path]) -> list[Path]:
    """The rule files: each path that is a file, and the rule files in each that is a
    folder, by name."""
    return [Path(name) for name, _ in rule_file_stats(directories)]


def rule_file_stats(directories: Iterable[Path]) -> list[tuple[str, os.stat_result | None]]:
    """:func:`rule_files` with each one's stat (None where it cannot be read).  The daemon
    looks on every tick, so through ``os.scandir``: with a hundred rule files the walk
    through ``Path`` methods cost the tick about 5 ms."""
    files: list[tuple[str, os.stat_result | None]] = []
    for directory in directories:
        name = os.fspath(directory)
        try:
            st = os.stat(name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append((name, st))
        elif stat.S_ISDIR(st.st_mode):
            try:
                with os.scandir(name) as it:
                    found = sorted(
                        (e for e in it if not e.name.startswith(".") and os.path.splitext(e.name)[1] in RULE_SUFFIXES),
                        key=lambda e: e.name,
                    )
            except OSError:
                continue
            for entry in found:
                try:
                    files.append((entry.path, entry.stat()))
                except OSError:
                    files.append((entry.path, None))
    return files


def read_rule_texts(paths: Iterable[Path]) -> dict[str, str | list[Problem]]:
    """Each rule file's text, or the problems met reading it (the input of resolve_rules)."""
    out: dict[str, str | list[Problem]] = {}
    for path in paths:
        try:
            out[str(path)] = read_text(path)
        except ConfigError as exc:
            out[str(path)] = exc.problems
    return out


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
                Problem(
                    path,
                    positions_line,
                    1,
                    "id",
                    f"rule id {rule.id!r} is already used by {other}",
                    "give each rule its own id",
                )
            )
            return
        self.rules[rule.id] = rule
        self.files[rule.id] = path


def _peek(text: str | list[Problem]) -> RuleFile | None:
    """A file read as YAML, or None when it cannot be (resolve_rules reports why)."""
    if not isinstance(text, str):
        return None
    try:
        return read_rule_file(text, "")
    except ConfigError:
        return None


def with_shipped_bases(files: dict[str, str | list[Problem]]) -> set[str]:
    """Add to ``files`` the shipped default rule files that ``extends:`` may name, so that a
    rule extending one needs no folder of them in tenants_dirs; returns the names added.  They
    are bases only: a shipped rule that nothing extends is not in force (list the folder in
    tenants_dirs for that).  One whose path, file name or id a file of ``files`` has is left out."""
    shipped = shipped_tenants_dir()
    if shipped is None:
        return set()
    # one of the same name is a copy of it, even where it cannot be read now
    present = {os.path.realpath(name) for name in files} | {os.path.basename(name) for name in files}
    ids = {rf.own_id for rf in map(_peek, files.values()) if rf and rf.own_id and rf.own_id != rf.data.get("extends")}
    added: set[str] = set()
    candidates = [p for p in rule_files([shipped]) if os.path.realpath(p) not in present and p.name not in present]
    for path, text in read_rule_texts(candidates).items():
        peeked = _peek(text)
        if peeked is not None and peeked.own_id not in ids:
            files[path] = text
            added.add(path)
    return added


def check_paths(
    paths: Iterable[Path], options_for: OptionsLookup, kinds: KindsLookup, bases: Iterable[Path] = ()
) -> RuleSet:
    """Read every rule file under ``paths`` (files or directories) and collect all problems.

    ``extends:`` is followed among them and the rule files under ``bases`` (the tenants dirs,
    when single files are checked): the checked files are judged as if put beside those, each
    taking the place of one there with the same path or id.  Only rules a checked file is
    part of are reported; a problem is filed under the file it is in.
    """
    checked = rule_files(paths)
    files = read_rule_texts(checked)
    same = {os.path.realpath(p) for p in checked}
    # ids the checked files take over; one that extends the rule of its own id builds on it instead
    ids = {rf.own_id for rf in map(_peek, files.values()) if rf and rf.own_id and rf.own_id != rf.data.get("extends")}
    for path, text in read_rule_texts(p for p in rule_files(bases) if os.path.realpath(p) not in same).items():
        peeked = _peek(text)
        if peeked is not None and peeked.own_id in ids:
            continue  # the checked file with this id stands in its place
        files[path] = text
    with_shipped_bases(files)
    resolution = resolve_rules(files, options_for, kinds)
    wanted = set(map(str, checked))
    ruleset = RuleSet()
    for top in files:
        chain = resolution.chains.get(top)
        if chain is None or wanted.isdisjoint(chain):
            continue
        if top in resolution.problems:
            for problem in resolution.problems[top]:
                filed = ruleset.problems.setdefault(problem.file, [])
                if problem not in filed:  # a base extended twice is part of both extensions' rules
                    filed.append(problem)
        else:
            ruleset.add(top, resolution.rules[top])
    return ruleset


# --- manifests -------------------------------------------------------------------------------


def parse_manifest(text: str, filename: str) -> Manifest:
    data, positions = load_yaml_mapping(text, filename)
    return validate(Manifest, data, filename, positions)
