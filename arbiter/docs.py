"""The generated parts of ``docs/``: the rule file and node config references (from the pydantic
models and the built-in plugins' options models) and the HTTP API (from the OpenAPI schema).

``python -m arbiter.docs`` rewrites the generated regions of the docs in place; ``--check``
changes nothing and exits 1 when a committed page differs from what the code says.  A region
is everything between ``<!-- BEGIN GENERATED: NAME -->`` and ``<!-- END GENERATED: NAME -->``;
the prose around it is written by hand.

It runs past 400 lines because every generated region's renderer sits beside the one
``--check`` that compares them all with the committed pages.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import tomllib
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from arbiter.plugin import HostSignal, Matcher, Probe, Reader, Source, Translator

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "uv run python -m arbiter.docs"
#: a kind's class, of any family
KindClass = type[Matcher] | type[Source] | type[Reader] | type[Probe] | type[Translator] | type[HostSignal]
#: distributions under plugins/ that only tests use: their kinds are not documented for users
TEST_ONLY = frozenset({"arbiter-testing"})
#: the families whose kinds are written in rule files, and where
RULE_FAMILIES = (
    ("matchers", "`match:`, and `match:` inside a source that watches processes"),
    ("sources", "`protect.source`, `during[].source`, `busy:` and `events:`"),
    ("translators", "`release:`, `reacquire:` and `profile:`"),
)
NODE_FAMILIES = (("readers", "`readers:` (by name, or as a block with options)"),)


# --- markdown from pydantic models ----------------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor a markdown renderer such as GitHub's gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def prose(doc: str | None) -> str:
    """A docstring as markdown: reST's double backticks become single ones."""
    return inspect.cleandoc(doc).replace("``", "`") if doc else ""


def own_doc(cls: type) -> str:
    """The class's own docstring (``inspect.getdoc`` would hand down a base class's)."""
    return prose(cls.__dict__.get("__doc__"))


@dataclass
class ModelDoc:
    """Renders models as sections, each once; later mentions link to the first."""

    #: models that render as a link instead of a section (plugin blocks)
    links: dict[type, str] = field(default_factory=dict)
    sections: dict[type, str] = field(default_factory=dict)  # model -> its heading
    queue: list[tuple[type[BaseModel], str]] = field(default_factory=list)

    def link(self, model: type[BaseModel], path: str) -> str:
        if model in self.links:
            return self.links[model]
        if model not in self.sections:
            self.sections[model] = f"`{path}`"
            self.queue.append((model, path))
        return f"[{self.sections[model]}](#{slug(self.sections[model])})"

    def type_of(self, annotation: Any, path: str) -> str:
        origin, args = get_origin(annotation), get_args(annotation)
        if annotation is type(None):
            return "null"
        if origin is Annotated:
            return self.type_of(args[0], path)
        if origin is Literal:
            kinds = {type(a) for a in args}
            return (
                {str: "string", int: "integer", bool: "boolean"}.get(kinds.pop(), "value")
                if len(kinds) == 1
                else "value"
            )
        if origin in (Union, types.UnionType):
            return " or ".join(self.type_of(a, path) for a in args)
        if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
            return f"list of {self.type_of(args[0], path + '[]')}"
        if origin is tuple:
            return "[" + ", ".join(self.type_of(a, path + "[]") for a in args) + "]"
        if origin is dict:
            return f"mapping of {self.type_of(args[0], path)} to {self.type_of(args[1], path + '.*')}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.link(annotation, path)
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        if annotation in names:
            return names[annotation]
        return "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))

    def section(self, model: type[BaseModel], heading: str, path: str, level: int = 3) -> str:
        self.sections.setdefault(model, heading)
        out = [f"{'#' * level} {heading}", ""]
        doc = own_doc(model)
        if doc:
            out += [doc, ""]
        out += fields_table(model, self, path)
        return "\n".join(out)

    def with_nested(self, model: type[BaseModel], heading: str) -> str:
        """A model's section, then a section per model its fields name (breadth first)."""
        parts = [self.section(model, heading, "")]
        while self.queue:
            nested, at = self.queue.pop(0)
            parts.append(self.section(nested, self.sections[nested], at))
        return "\n\n".join(parts)


def constraints(info: FieldInfo, annotation: Any) -> list[str]:
    """What a field allows besides its type: values, bounds, patterns."""
    out: list[str] = []
    for arg in _literals(annotation):
        out.append(f"`{_plain(arg)}`")
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    for meta in info.metadata:
        for attr, sign in signs.items():
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {_plain(value)}")
        if getattr(meta, "max_length", None) is not None:
            out.append(f"at most {meta.max_length} long")
        if getattr(meta, "min_length", None) is not None:
            out.append(f"at least {meta.min_length} long")
        if getattr(meta, "pattern", None) is not None:
            out.append(f"matches `{meta.pattern}`")
    return out


def _literals(annotation: Any) -> list[Any]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return list(args)
    if origin in (Union, types.UnionType, Annotated, list, dict):
        return [v for a in args for v in _literals(a)]
    return []


def _plain(value: Any) -> str:
    """A value as a YAML file would spell it."""
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def default_of(info: FieldInfo) -> str:
    if info.default_factory is not None:
        factory = info.default_factory
        if factory in (list, tuple):
            return "`[]`"
        if factory is dict:
            return "`{}`"
        if isinstance(factory, type) and issubclass(factory, BaseModel):
            return "each field's default"
        return "depends on the account (see its description)"
    if info.default is PydanticUndefined:
        return "**required**"
    if isinstance(info.default, BaseModel):
        return "each field's default"
    return f"`{_plain(info.default)}`"


def fields_table(model: type[BaseModel], doc: ModelDoc, path: str, skip: Iterable[str] = ()) -> list[str]:
    skipped = set(skip)
    rows = ["| field | type | default | allowed | description |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in skipped:
            continue
        key = info.alias or name
        annotation = info.annotation
        rows.append(
            "| "
            + " | ".join(
                cell(c)
                for c in (
                    f"`{key}`",
                    doc.type_of(annotation, f"{path}.{key}" if path else key),
                    default_of(info),
                    ", ".join(constraints(info, annotation)),
                    info.description or "",
                )
            )
            + " |"
        )
    if len(rows) == 2:
        return ["No options besides `kind`."]
    return rows


# --- plugin kinds ----------------------------------------------------------------------------------


def builtin_distributions(root: Path) -> set[str] | None:
    """The distributions under ``plugins/`` (the shipped ones), or None outside a checkout."""
    folder = root / "plugins"
    if not folder.is_dir():
        return None
    names = set()
    for pyproject in folder.glob("*/pyproject.toml"):
        names.add(tomllib.loads(pyproject.read_text())["project"]["name"])
    return names - TEST_ONLY


def kind_facts(cls: KindClass) -> list[str]:
    """What a kind declares on its class that a rule author needs to know."""
    facts = []
    if getattr(cls.Options, "runs_command", False):
        facts.append(
            "runs a command: a rule file using it must be owned by root or the daemon's user and writable by no one else"
        )
    if issubclass(cls, Source) and cls.match_option:
        facts.append(f"watches processes: its `{cls.match_option}` option is a matcher block")
    if getattr(cls, "uses_vram", False):
        facts.append("judges from the VRAM its tenant holds")
    actions = getattr(cls, "actions", None)
    if actions:
        facts.append("can do " + ", ".join(f"`{a}`" for a in sorted(actions)))
    if getattr(cls, "stand_in", False):
        facts.append("is a stand-in (not a GPU): it counts only with `stand_in_gpu: true`")
    preference = getattr(cls, "preference", None)
    if isinstance(preference, int):
        facts.append(f"has preference {preference} (lower is tried first without `readers:`)")
    return facts


def kinds_section(families: Iterable[tuple[str, str]], root: Path, level: int = 3) -> str:
    from arbiter.pluginmanager import build_plugin_manager

    host = build_plugin_manager()
    try:
        shipped = builtin_distributions(root)
        parts = []
        for family, where in families:
            parts.append(f"{'#' * level} {family.capitalize()}\n\nUsed in {where}.")
            for name in host.kind_names(family):
                info = host.kind(family, name)
                assert info is not None
                dist = info.distribution.split(" ")[0]
                if shipped is not None and dist not in shipped:
                    continue  # a plugin installed here, not shipped: its own docs cover it
                parts.append(kind_section(family, name, info.cls, dist, level + 1))
        return "\n\n".join(parts)
    finally:
        host.close()


def kind_section(family: str, name: str, cls: KindClass, dist: str, level: int) -> str:
    out = [f"{'#' * level} {family[:-1]} `{name}`", "", f"From `{dist}`."]
    # the class's first paragraph says what it does; the rest is for its maintainers
    for text in (own_doc(cls).split("\n\n")[0], own_doc(cls.Options)):
        if text:
            out += ["", text]
    facts = kind_facts(cls)
    if facts:
        out += ["", "It " + "; it ".join(facts) + "."]
    doc = ModelDoc()
    out += ["", *fields_table(cls.Options, doc, "", skip=("kind",))]
    while doc.queue:
        nested, at = doc.queue.pop(0)
        out += ["", doc.section(nested, doc.sections[nested], at, level + 1)]
    return "\n".join(out)


# --- the regions -----------------------------------------------------------------------------------


def _rule_doc() -> ModelDoc:
    from arbiter.config.models import KindBlock, MatchBlock

    return ModelDoc(links={KindBlock: "[plugin block](#plugin-kinds)", MatchBlock: "[matcher block](#matchers)"})


def rule_reference(root: Path) -> str:
    from arbiter.config.models import Rule

    return _rule_doc().with_nested(Rule, "The rule")


def node_reference(root: Path) -> str:
    from arbiter.config.models import KindBlock, NodeConfig

    return ModelDoc(links={KindBlock: "[reader block](#readers)"}).with_nested(NodeConfig, "The node config")


def manifest_reference(root: Path) -> str:
    from arbiter.config.jobdocs import Manifest

    return ModelDoc().with_nested(Manifest, "The manifest")


def rule_kinds(root: Path) -> str:
    return kinds_section(RULE_FAMILIES, root)


def node_kinds(root: Path) -> str:
    return kinds_section(NODE_FAMILIES, root)


def plugin_sections(root: Path) -> str:
    """The node config's sections that the shipped plugins read."""
    from arbiter.pluginmanager import build_plugin_manager

    host = build_plugin_manager()
    try:
        shipped = builtin_distributions(root)
        parts = []
        for name, info in sorted(host.sections.items()):
            dist = info.distribution.split(" ")[0]
            if shipped is not None and dist not in shipped:
                continue  # a plugin installed here, not shipped: its own docs cover it
            out = [f"### `{name}:`", "", f"From `{dist}`."]
            if own_doc(info.model):
                out += ["", own_doc(info.model)]
            doc = ModelDoc()
            out += ["", *fields_table(info.model, doc, name)]
            while doc.queue:
                nested, at = doc.queue.pop(0)
                out += ["", doc.section(nested, doc.sections[nested], at, 4)]
            parts.append("\n".join(out))
        return "\n\n".join(parts) or "No shipped plugin reads a section of its own."
    finally:
        host.close()


class _NoProvider:
    """Stands in for the daemon: building the schema calls nothing on it."""

    token = ""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise LookupError(f"no daemon behind the docs generator ({name})")

        return unavailable


def openapi_schema() -> dict[str, Any]:
    from arbiter.http.app import create_app

    return create_app(_NoProvider()).openapi()


def _schema_type(schema: dict[str, Any], components: dict[str, Any]) -> str:
    if "$ref" in schema:
        ref: str = schema["$ref"]
        return ref.rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_type(s, components) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_type(schema.get('items', {}), components)}"
    return str(kind)


def _bounds(schema: dict[str, Any]) -> str:
    marks = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
    return ", ".join(f"{sign} {schema[k]}" for k, sign in marks.items() if k in schema)


def _auth(operation: dict[str, Any]) -> str:
    if operation.get("security"):
        return "needs " + ", ".join(sorted(name for req in operation["security"] for name in req))
    headers = {p["name"].lower() for p in operation.get("parameters", []) if p.get("in") == "header"}
    if "authorization" in headers:
        return "needs the token (`Authorization: Bearer TOKEN`, TOKEN from `$state_dir/token`)"
    return "none"


def http_reference(root: Path) -> str:
    spec = openapi_schema()
    components = spec.get("components", {}).get("schemas", {})
    out = [f"OpenAPI {spec.get('openapi', '')}, API version {spec['info'].get('version', '')}."]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            out += ["", f"### `{method.upper()} {path}`", "", f"**{op.get('summary', '')}**."]
            if op.get("description"):
                out += ["", prose(op["description"])]
            out += ["", f"Auth: {_auth(op)}."]
            params = [p for p in op.get("parameters", []) if p["name"].lower() != "authorization"]
            if params:
                out += ["", "| parameter | in | type | required | default | description |", "|---|---|---|---|---|---|"]
                for p in params:
                    schema = p.get("schema", {})
                    kind = _schema_type(schema, components)
                    bounds = _bounds(schema)
                    default = f"`{schema['default']}`" if "default" in schema else ""
                    row = (
                        f"`{p['name']}`",
                        p["in"],
                        kind + (f" ({bounds})" if bounds else ""),
                        "yes" if p.get("required") else "no",
                        default,
                        p.get("description", ""),
                    )
                    out.append("| " + " | ".join(cell(c) for c in row) + " |")
            if "requestBody" in op:
                content = op["requestBody"].get("content", {})
                body = ", ".join(
                    f"{media} ({_schema_type(c.get('schema', {}), components)})" for media, c in content.items()
                )
                out += ["", f"Request body: {body}."]
            out += ["", "| status | meaning | content |", "|---|---|---|"]
            for status, response in op.get("responses", {}).items():
                content = response.get("content", {})
                body = ", ".join(
                    f"`{media}`" + (f" {_schema_type(c['schema'], components)}" if c.get("schema") else "")
                    for media, c in content.items()
                )
                out.append(f"| {status} | {cell(response.get('description', ''))} | {cell(body)} |")
    return "\n".join(out)


#: page -> region name -> what writes it
def codes_reference(root: Path) -> str:
    """Every code, from :data:`arbiter.engine.codes.CATALOGUE`, holds first."""
    from arbiter.engine.codes import CATALOGUE

    headings = {"hold": "Holds", "problem": "Problems", "event": "Timeline events"}
    out = []
    for kind, heading in headings.items():
        out += [f"### {heading}", "", "| code | what it means | what to do |", "|---|---|---|"]
        out += [f"| `{c.name}` | {cell(c.meaning)} | {cell(c.remedy) or '—'} |" for c in CATALOGUE if c.kind == kind]
        out.append("")
    return "\n".join(out)


REGIONS: dict[str, dict[str, Callable[[Path], str]]] = {
    "docs/rule-files.md": {"rule reference": rule_reference, "rule kinds": rule_kinds},
    "docs/node-config.md": {
        "node reference": node_reference,
        "reader kinds": node_kinds,
        "plugin sections": plugin_sections,
        "manifest reference": manifest_reference,
    },
    "docs/http-api.md": {"http reference": http_reference},
    "docs/codes.md": {"codes": codes_reference},
}


class RegionMissing(Exception):
    pass


def fill(text: str, page: str, name: str, content: str) -> str:
    begin, end = f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise RegionMissing(f"{page} has no region {name!r}: add the lines {begin} and {end} where it goes")
    note = f"<!-- written by `{REGENERATE}` from the code; edit the code, not this region -->"
    return text[: start + len(begin)] + f"\n{note}\n\n{content.strip()}\n\n" + text[stop:]


def generate(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Every generated page: path -> (committed text, text with regions regenerated)."""
    pages = {}
    for page, regions in REGIONS.items():
        path = root / page
        old = path.read_text() if path.exists() else ""
        new = old
        for name, make in regions.items():
            new = fill(new, page, name, make(root))
        pages[page] = (old, new)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arbiter.docs", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page is out of date")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout holding docs/ (default: this one)")
    args = parser.parse_args(argv)
    try:
        pages = generate(args.root)
    except RegionMissing as exc:
        print(f"arbiter.docs: {exc}", file=sys.stderr)
        return 2
    stale = [page for page, (old, new) in pages.items() if old != new]
    if args.check:
        for page in stale:
            print(f"arbiter.docs: {page} is out of date; run `{REGENERATE}` and commit the result", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        (args.root / page).write_text(pages[page][1])
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
