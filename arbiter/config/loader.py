"""Reading and validating arbiter's files, with errors that point at a line: the node config
and job manifests here; rule files in :mod:`arbiter.config.rules` (validation, ``extends:``)
and :mod:`arbiter.config.ruleset` (the files of the tenants dirs), whose names this module
offers too, as the one place a caller imports from.
"""

from __future__ import annotations

import os
from pathlib import Path

from arbiter.config.errors import ConfigError, Problem
from arbiter.config.jobdocs import Manifest
from arbiter.config.locate import find_config, relative_to_config
from arbiter.config.models import NodeConfig
from arbiter.config.rulefile import (
    RULE_BLOCKS,
    MergedRule,
    RuleFile,
    merge_rule_files,
    raw_kind_blocks,
    read_rule_file,
    with_base_url,
)
from arbiter.config.rules import (
    COMMAND_FILE_HINT,
    CommandCheck,
    KindsLookup,
    OptionsLookup,
    Resolution,
    parse_rule,
    resolve_rules,
)
from arbiter.config.ruleset import (
    RULE_SUFFIXES,
    RuleFileLook,
    RuleSet,
    check_paths,
    read_rule_texts,
    rule_file_stats,
    rule_files,
    with_shipped_bases,
)
from arbiter.config.sections import misspelt_keys
from arbiter.config.validation import (
    known_keys,
    load_yaml_mapping,
    problems_from,
    read_text,
    validate,
    validate_kind_options,
)

__all__ = [
    "COMMAND_FILE_HINT",
    "RULE_BLOCKS",
    "RULE_SUFFIXES",
    "CommandCheck",
    "KindsLookup",
    "MergedRule",
    "OptionsLookup",
    "Resolution",
    "RuleFile",
    "RuleFileLook",
    "RuleSet",
    "check_paths",
    "known_keys",
    "load_node_config",
    "load_yaml_mapping",
    "merge_rule_files",
    "parse_manifest",
    "parse_node_config",
    "parse_rule",
    "problems_from",
    "raw_kind_blocks",
    "read_rule_file",
    "read_rule_texts",
    "read_text",
    "resolve_paths",
    "resolve_rules",
    "rule_file_stats",
    "rule_files",
    "validate",
    "validate_kind_options",
    "with_base_url",
    "with_shipped_bases",
]


def parse_node_config(text: str, filename: str) -> NodeConfig:
    data, positions = load_yaml_mapping(text, filename)
    config = validate(NodeConfig, data, filename, positions)
    misspelt = misspelt_keys(config, filename, positions)
    if misspelt:
        raise ConfigError(misspelt)
    return config


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


def parse_manifest(text: str, filename: str, default_name: str | None = None) -> Manifest:
    """A job manifest; ``default_name`` (the command line's ``--name``, or its command's) stands
    in for a ``name:`` it does not give."""
    data, positions = load_yaml_mapping(text, filename)
    if default_name is not None and "name" not in data:
        data = {**data, "name": default_name}
    return validate(Manifest, data, filename, positions)
