"""JSON Schemas for arbiter's files and wire protocol (``arbiter schema``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from arbiter.config.models import ControlDocument, JobEvent, Manifest, NodeConfig, Rule

SCHEMAS: dict[str, type[BaseModel]] = {
    "node": NodeConfig,
    "rule": Rule,
    "manifest": Manifest,
    "control": ControlDocument,
    "event": JobEvent,
}


def schema_for(what: str) -> dict[str, Any]:
    if what == "all":
        return {name: schema_for(name) for name in SCHEMAS}
    schema = SCHEMAS[what].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
