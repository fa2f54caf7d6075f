"""JSON Schemas for arbiter's files and wire protocol (``arbiter schema``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from arbiter.config.jobdocs import ControlDocument, JobEvent, Manifest
from arbiter.config.models import NodeConfig, Rule

SCHEMAS: dict[str, type[BaseModel]] = {
    "node": NodeConfig,
    "rule": Rule,
    "manifest": Manifest,
    "control": ControlDocument,
    "event": JobEvent,
}

#: family → the installed kinds' options models, by kind name
Kinds = Callable[[str], Mapping[str, type[BaseModel]]]

#: where a rule holds plugin blocks: (the schema object that has the property, the property, family)
_RULE_BLOCKS = (
    ((), "match", "matchers"),
    ((), "busy", "sources"),
    ((), "events", "sources"),
    ((), "release", "translators"),
    ((), "reacquire", "translators"),
    ((), "profile", "translators"),
    (("$defs", "Protect"), "source", "sources"),
    (("$defs", "During"), "source", "sources"),
)
_BLOCK_REFS = ("#/$defs/KindBlock", "#/$defs/MatchBlock")


def schema_for(
    what: str, kinds: Kinds | None = None, sections: Mapping[str, type[BaseModel]] | None = None
) -> dict[str, Any]:
    """The JSON Schema of ``what``; with ``kinds``, a rule's plugin blocks are each one of
    the installed kinds' own options (so an editor catches a typo inside ``busy:``); with
    ``sections``, the node config takes those plugins' sections and no other key."""
    if what == "all":
        return {name: schema_for(name, kinds, sections) for name in SCHEMAS}
    schema = SCHEMAS[what].model_json_schema()
    if what == "rule" and kinds is not None:
        _with_kinds(schema, kinds)
    if what == "node" and sections is not None:
        _with_sections(schema, sections)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def _with_kinds(schema: dict[str, Any], kinds: Kinds) -> None:
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    choices: dict[str, dict[str, Any]] = {}
    for family in sorted({family for _, _, family in _RULE_BLOCKS}):
        refs = []
        for name, model in sorted(kinds(family).items()):
            key = f"{family}.{name}"
            sub = model.model_json_schema(ref_template="#/$defs/{model}")
            for nested, body in sub.pop("$defs", {}).items():
                defs.setdefault(nested, body)
            if family != "matchers":  # a match block may leave kind out (it is process)
                sub["required"] = sorted({*sub.get("required", []), "kind"})
            defs[key] = sub
            refs.append({"$ref": f"#/$defs/{key}"})
        choices[family] = {"oneOf": refs} if refs else {"$ref": _BLOCK_REFS[0]}
    for where, prop, family in _RULE_BLOCKS:
        holder: Any = schema
        for step in where:
            holder = holder.get(step, {})
        props = holder.get("properties", {})
        if prop in props:
            props[prop] = _replace_refs(props[prop], choices[family])


def _with_sections(schema: dict[str, Any], sections: Mapping[str, type[BaseModel]]) -> None:
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    for name, model in sorted(sections.items()):
        sub = model.model_json_schema(ref_template="#/$defs/{model}")
        for nested, body in sub.pop("$defs", {}).items():
            defs.setdefault(nested, body)
        defs[f"sections.{name}"] = sub
        schema["properties"][name] = {"$ref": f"#/$defs/sections.{name}"}
    schema["additionalProperties"] = False


def _replace_refs(node: Any, choice: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if node.get("$ref") in _BLOCK_REFS:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return {**choice, **rest}
        return {k: _replace_refs(v, choice) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_refs(v, choice) for v in node]
    return node
