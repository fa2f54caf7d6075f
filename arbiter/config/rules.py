"""Validating rule files in both stages: the outer :class:`~arbiter.config.models.Rule`
model, then every ``{kind: ...}`` block against the options model of the plugin that
registered the kind; :func:`resolve_rules` does it for a set of files together, following
``extends:``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from arbiter.config.errors import ConfigError, Problem, did_you_mean
from arbiter.config.models import KindBlock, Rule
from arbiter.config.rulefile import RuleFile, merge_rule_files, raw_kind_blocks, read_rule_file, with_base_url
from arbiter.config.safety import command_file_problem
from arbiter.config.validation import field_path, problems_from, validate, validate_kind_options
from arbiter.config.yamlpos import Path_, anchor_of, position_of
from arbiter.plugin import KindOptions

#: (family, kind) → the kind's options model, or None when no plugin registers it
OptionsLookup = Callable[[str, str], "type[BaseModel] | None"]
#: family → the kinds it has, for hints; ``translators:ACTION`` → those that can do ACTION
KindsLookup = Callable[[str], "list[str]"]


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
        at = field_path(loc)
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
                    f"{at}.kind",
                    f"unknown {family[:-1]} kind {kind!r}",
                    did_you_mean(kind, kinds(family), f"known {family[:-1]} kinds"),
                )
            )
            continue
        role = loc[0] if family == "translators" and len(loc) == 1 else ""
        able = kinds(f"translators:{role}") if role else []
        if role and kind not in able:
            # it would load, and fail only when first asked to act
            file, line, col = where((*loc, "kind"))
            problems.append(
                Problem(
                    file,
                    line,
                    col,
                    f"{at}.kind",
                    f"the {kind} translator cannot {role} (a {role}: block needs one that can)",
                    f"translator kinds that can {role}: {', '.join(able)}"
                    if able
                    else f"no installed translator can {role}",
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
            gives_phase = getattr(options, "gives_phase", lambda: None)()
            if tuple(loc) == ("protect", "source") and gives_phase is True:
                file, line, col = where(loc)
                problems.append(
                    Problem(
                        file,
                        line,
                        col,
                        at,
                        f"a {kind} source with these options gives a phase (on, off, soon), not the rate "
                        "protect.source needs",
                        "give it the options of a count (for jsonl: event alone; for log: log_regex), or move "
                        "it to during:, which takes a phase",
                    )
                )
            if loc[0] == "during" and gives_phase is False:
                file, line, col = where(loc)
                problems.append(
                    Problem(
                        file,
                        line,
                        col,
                        at,
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
                            f"{at}.kind",
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
    twice, a cycle, and an extension from a file less safe than its base's (see
    :func:`arbiter.config.safety.command_file_problem`: trust never grows by extension) are
    problems at the extension's ``extends`` line.
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
        if len(bases) > 1 and not command_check(path):
            # a file others may change never stands in the way of a trusted extension by
            # giving itself the trusted base's id: only the bases as trusted as it count
            trusted = [p for p in bases if not command_check(p)]
            bases = trusted if len(trusted) == 1 else bases
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

    # Trust never grows by extension: a file more accounts may change than its base's may not
    # change that rule (set protect: null, during: [], a match that matches nothing); the base
    # stands by itself and the extension says why.
    unsafe: dict[str, str | None] = {}
    for ext, base in list(base_of.items()):
        for path in (ext, base):
            if path not in unsafe:
                unsafe[path] = command_check(path)
        if unsafe[ext] and not unsafe[base]:
            fail(
                ext,
                f"this file may not change rule {parsed[base].own_id!r} of {base}: that file only root or the "
                f"daemon's user can change, and this one others can ({unsafe[ext]}); that rule keeps its own values",
                f"put the change in a file only root can change ({COMMAND_FILE_HINT}), or give this rule an id of "
                "its own instead of extends",
            )
            del base_of[ext]

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
