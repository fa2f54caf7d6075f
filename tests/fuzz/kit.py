"""Bad input for every format arbiter reads, and each input fed through the entry point a user hits.

Used by the tests beside it (a few hundred inputs per format) and by ``bench/fuzz_configs.py``
(ten thousand).  Inputs come from arbiter's own JSON Schemas (hypothesis-jsonschema) and from
valid examples (the shipped rule files, the demo's, documents the SDK writes) mutated: keys
dropped or renamed, wrong types, out-of-range numbers, huge and control-character strings,
deep nesting, YAML oddities, bytes that are not UTF-8, truncated text.

Each input ends in one :class:`Verdict`:

- ``accepted``: the entry point took it;
- ``rejected``: it refused it with the documented error, which says where (file and line, or
  the field path, or the request's op and argument); for what the daemon or a job reads
  (sources, control documents) a refusal is the input being counted and skipped;
- ``unlocated``: refused without saying where (a failure);
- ``wrong_reject``: an input known to be valid (a seed, or schema-valid) was refused (a failure);
- ``crash``: any other exception, or a daemon-side path letting one through (a failure).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
import shutil
import socket
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import yaml
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[2]

FORMATS = ("rule", "node", "manifest", "control", "event", "jsonl", "log", "socket", "http")
OUTCOMES = ("accepted", "rejected", "unlocated", "wrong_reject", "crash")
FAILURES = ("unlocated", "wrong_reject", "crash")


@dataclass(frozen=True)
class Case:
    """One input: the bytes as written (a file, a line, a request), and whether it is known valid."""

    data: bytes
    valid: bool = False
    how: str = ""  # how it was made, for the report of a failure
    extra: Any = None  # format-specific (history of a followed file, an HTTP request)


@dataclass(frozen=True)
class Verdict:
    outcome: str
    detail: str = ""


# --- seeds: valid documents ---------------------------------------------------------------------


def rule_seeds() -> list[str]:
    texts = [p.read_text() for p in sorted((ROOT / "tenants.d").glob("*.yaml"))]
    texts += [p.read_text() for p in sorted((ROOT / "examples/demo/tenants.d").glob("*.yaml"))]
    texts += [
        "extends: llm-server\npriority: 70\n",
        "id: my-diffusion\nextends: diffusion-server\nneeds_vram_gb: 24\nprotect: {metric: gpu_share}\n",
        "id: trainer\nkind: trainer\nmatch:\n  cmdline: [train.py]\n  tree: descendants\nimmediate: true\n"
        "protect:\n  metric: progress_rate\n  source: {kind: log, path: /var/log/trainer.log, log_regex: 'step \\d+'}\n"
        "during:\n  - source: {kind: jsonl, path: '~/events-*.jsonl', enter: upload_start, exit: upload_end}\n"
        "    pause_fleet: {scope: all}\n    tags: [uplink]\n",
        "id: game\nkind: other\npriority: 80\nmatch: {name: [game.exe], user: alice}\n"
        "during:\n  - source: {kind: on_exec, match: {name: [blender]}}\n",
    ]
    return texts


def node_seeds() -> list[str]:
    demo = (ROOT / "examples/demo/arbiter.yaml").read_text()
    spec = (
        "gpu_jobs: certified\ntick_s: 2\ngpu_busy_threshold: 0.05\ngpu_release_after_s: 10\n"
        "tenants_dirs: [/etc/arbiter/tenants.d]\nreaders: [nvml, drm_fdinfo]\nstand_in_gpu: false\n"
        "governor: {period_s: 60, baseline_s: 60, rebaseline_s: 1800, take_back_s: 300, grow_step: 0.05}\n"
        "memory_guard: {min_available: 0.10}\nadmin_group: arbiter\nplugins: [mysite_arbiter_sampler]\n"
        'disable_plugins: []\nstate_dir: /var/lib/arbiter\nhttp:\n  listen: "127.0.0.1:7807"\n'
    )
    local = yaml.safe_dump(
        {
            "state_dir": "state",
            "tenants_dirs": ["tenants.d"],
            "readers": ["cpu_time"],
            "stand_in_gpu": True,
            "tick_s": 0.5,
            "http": {"listen": "127.0.0.1:0"},
            "compliance": {"sample_s": 1, "over_samples": 2},
            "translators": {"pause": ["sigstop"]},
        }
    )
    return [demo, spec, local, "{}\n", "# nothing set: every default\n"]


def manifest_seeds() -> list[str]:
    return [
        "name: llmbatch\ncapabilities: [cooperative_throttle, cooperative_pause, progress_events]\n"
        "gpu: {use: shared, apis_any: [cuda, rocm, metal], max_duty: 0.5}\n",
        "name: render-farm\ngpu:\n  use: exclusive\n  apis_any: [vulkan]\n  in_container: true\n"
        "variants:\n  darwin: {use: shared, apis_any: [metal]}\n  windows: {use: none}\n",
        "name: cpu-only\ngpu: {use: none}\n",
        "name: a\n",
    ]


def control_seeds() -> list[bytes]:
    """Documents as the daemon writes them, through the SDK's own writer."""
    import tempfile

    from arbiter.sdk.control import write_control_document

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "control.json")
        for seq, (state, duty, reason) in enumerate(
            [
                ("run", 1.0, ""),
                ("paused", 0.0, "a protected program is uploading"),
                ("run", 0.35, "budget"),
                ("stop", 0.0, "stopped by its owner"),
            ]
        ):
            write_control_document(path, state, duty, seq * 5, reason)
            out.append(Path(path).read_bytes())
    return out


def event_seeds() -> list[bytes]:
    """Lines as a job writes them, through the SDK's own writer (arbiter.sdk.control.append_event)."""
    import tempfile

    from arbiter.sdk.control import append_event

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events.jsonl")
        append_event(path, "phase", phase="warmup")
        append_event(path, "progress", done=3, total=10)
        append_event(path, "progress", done=3, total=None)
        append_event(path, "metric", name="gpu_duty", busy=0.31, duty=0.3, device="gpu")
        append_event(path, "stop_ack")
        return Path(path).read_bytes().splitlines()


# --- mutation -----------------------------------------------------------------------------------

#: strings that break things: control characters, unicode, quotes, YAML and JSON syntax
NASTY_TEXT = (
    "",
    " ",
    "\t",
    "\x00",
    "\x07bell",
    "\x1b[31m",
    "\u202egnp.exe",
    "é",
    "日本語",
    "\U0001f600",
    "\ufeff",
    "\u2028",
    "null",
    "~",
    "on",
    "yes",
    "1e999",
    "-0",
    "0x10",
    "'",
    '"',
    "\\",
    "${HOME}",
    "*alias",
    "&anchor",
    "!!python/object:os.system",
    "- a",
    "{a: 1}",
    "[1",
    "%",
    "@",
    "`",
    "../../etc/passwd",
    "~nosuchuser9/x",
    "/",
    "a" * 65,
    "a{99999999999}",
    "(" * 300 + ")" * 300,
    "\ud7ff",
    "x\ny",
    "key: value",
)


def _huge_text(n: int) -> str:
    return "x" * n


def weird_values() -> st.SearchStrategy[Any]:
    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63) - 1, 10**30]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.0, -0.0, 1e-300, 1.0000001, 0.9999999, 1e308, -1e308]),
        st.sampled_from(NASTY_TEXT),
        st.text(max_size=40),
        st.sampled_from([1000, 70_000]).map(_huge_text),
    )
    return st.one_of(
        scalar,
        st.lists(scalar, max_size=4),
        st.dictionaries(st.text(max_size=8), scalar, max_size=3),
        st.sampled_from([{"kind": "jsonl"}, {"kind": "nosuch"}, {"kind": 3}, {}, [], [[]]]),
    )


def _paths(doc: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if len(here) > 12:
        return  # inside a value nested deep on purpose
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*here, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*here, i))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _nest(value: Any, depth: int) -> Any:
    if depth > 20:  # too deep for the dumpers: a marker that _deepen writes out as text
        return f"@@deep{depth}@@"
    for _ in range(depth):
        value = [value]
    return value


def _deepen(text: str) -> str:
    return re.sub(r"[\"']?@@deep(\d+)@@[\"']?", lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), text)


@st.composite
def mutated_doc(draw: st.DrawFn, seeds: list[Any]) -> Any:
    """A seed document with one to three structural changes at places in it."""
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["drop", "rename", "replace", "replace", "add", "wrap", "nest", "range"]))
        if not path:
            if op in ("replace", "wrap", "nest"):
                doc = (
                    draw(weird_values())
                    if op == "replace"
                    else _nest(doc, 1 if op == "wrap" else draw(st.sampled_from([2, 600])))
                )
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "drop":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            new = draw(
                st.sampled_from(
                    [str(key) + "s", str(key).upper(), str(key)[:-1] or "_", " " + str(key), str(key) + "\x00"]
                )
            )
            parent[new] = parent.pop(key)
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["colour", "kind", "id", "", "__proto__", "match"]))] = draw(weird_values())
        elif op == "wrap":
            parent[key] = [parent[key]]
        elif op == "nest":
            parent[key] = _nest(parent[key], draw(st.sampled_from([2, 50, 600])))
        elif op == "range" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = draw(st.sampled_from([-1, -0.0001, 0, 1.0001, 61, 1001, 65536, 10**20, math.inf, math.nan]))
        else:
            parent[key] = draw(weird_values())
    return doc


def _dump_yaml(doc: Any, flow: bool, unicode: bool) -> str:
    return _deepen(yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=unicode, sort_keys=False, width=10_000))


#: text-level damage a YAML file can suffer
YAML_ODDITIES = (
    "x: !!python/object/apply:os.system ['true']\n",
    "x: !!python/name:os.system\n",
    "x: !!binary aGVsbG8=\n",
    "x: !custom 3\n",
    "a: &a 1\nb: *a\n",
    "b: *nosuch\n",
    "<<: {id: merged}\n",
    "<<: 3\n",
    "? [a, b]\n: c\n",
    "? {a: 1}\n: c\n",
    "---\nid: second\n",
    "...\n",
    "%YAML 1.1\n---\n",
    "%TAG ! tag:x,2000:\n---\n",
    "\tid: tab\n",
    "id: [unclosed\n",
    "id: 'unclosed\n",
    'id: "\\xZZ"\n',
    "id: 2024-13-45\n",
    "id: 2024-02-30 25:61:61\n",
    "id: " + "9" * 5000 + "\n",
    "id: 0o9\n",
    "id: .nan\n",
    "id: -.inf\n",
    "id: 1_000\n",
    "id: 0b101\n",
    "id: 1:20:30\n",
    "a: &x [*x]\n",
    "x: " + "[" * 600 + "]" * 600 + "\n",
    "x: " + "{a: " * 600 + "1" + "}" * 600 + "\n",
    "x: |\n  block\n   text\n",
    "x: >-\n  folded\n",
    "x:\n- a\n - b\n",
    "- just\n- a list\n",
    "plain scalar\n",
    "",
    "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
)
BAD_BYTES = (
    b"\xff",
    b"\xfe\xff",
    b"\x80",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\x00",
    b"\x07",
    b"\x1b",
    b"\r",
    b"\r\n",
    b"\x85",
    b"\xef\xbb\xbf",
    b"\xe2\x80\xa8",
)


@st.composite
def damaged(draw: st.DrawFn, text: bytes, oddities: Sequence[str]) -> bytes:
    """``text`` with damage at a byte or a line: truncation, stray bytes, an oddity, a duplicate line."""
    op = draw(st.sampled_from(["truncate", "bytes", "oddity", "oddity", "dup", "tab", "bom", "crlf", "garble"]))
    at = draw(st.integers(0, len(text)))
    if op == "truncate":
        return text[:at]
    if op == "bytes":
        return text[:at] + draw(st.sampled_from(BAD_BYTES)) + text[at:]
    if op == "oddity":
        odd = draw(st.sampled_from(oddities)).encode()
        return draw(st.sampled_from([odd + text, text + b"\n" + odd, odd]))
    lines = text.split(b"\n")
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    if op == "dup":
        lines.insert(i, lines[i])
    elif op == "tab":
        lines[i] = b"\t" + lines[i]
    elif op == "bom":
        return b"\xef\xbb\xbf" + text
    elif op == "crlf":
        return text.replace(b"\n", b"\r\n")
    else:
        lines[i] = draw(st.binary(max_size=30))
    return b"\n".join(lines)


# --- strategies per format ----------------------------------------------------------------------


class _ManyWithMore:
    """hypothesis-jsonschema 0.23 draws an object's keys through ``many(...).more()``, which
    Hypothesis 6.150+ replaced with a context manager and an iterator; this gives it back."""

    def __init__(self, data: Any, min_size: int, max_size: float, average_size: float) -> None:
        from hypothesis.internal.conjecture import utils as cu

        self._many = cu.many(data, min_size=min_size, max_size=max_size, average_size=average_size)
        self._many.__enter__()
        self._each = iter(self._many)

    def more(self) -> bool:
        try:
            next(self._each)
            return True
        except StopIteration:
            self._many.__exit__(None, None, None)
            return False

    def reject(self) -> None:
        self._many.reject()


def _mend_hypothesis_jsonschema() -> None:
    from types import SimpleNamespace

    import hypothesis_jsonschema._from_schema as hjs
    from hypothesis.internal.conjecture import utils as cu

    # its own name for the module, which it does not export: reached by name, as it is patched
    if hasattr(cu.many, "more") or isinstance(getattr(hjs, "cu"), SimpleNamespace):  # noqa: B009
        return  # a version that still has it, or mended already
    setattr(hjs, "cu", SimpleNamespace(**{**vars(cu), "many": _ManyWithMore}))  # noqa: B010


@functools.cache
def _schema(what: str) -> dict[str, Any]:
    from arbiter.config.schemas import schema_for

    return schema_for(what)


@functools.cache
def _from_schema(what: str) -> st.SearchStrategy[Any]:
    return from_schema(_schema(what))  # built once: canonicalising a schema is slow


@functools.cache
def _validator(what: str) -> Any:
    schema = _schema(what)
    return jsonschema.validators.validator_for(schema)(schema)


def _schema_valid(what: str, doc: Any) -> bool:
    try:
        return bool(_validator(what).is_valid(doc))
    except RecursionError:
        return False


def _passes_model_checks(what: str, doc: Any) -> bool:
    """The checks a JSON Schema cannot say, which the models make (see arbiter.config.models)."""
    if what == "manifest":
        uses = [doc.get("gpu", {}), *doc.get("variants", {}).values()]
        return not any(u.get("apis_any") and u.get("use") == "none" for u in uses)
    if what == "node":
        host, sep, port = doc.get("http", {}).get("listen", "127.0.0.1:7807").rpartition(":")
        paths = [doc.get("state_dir", "/x"), *doc.get("tenants_dirs", [])]
        fleet = doc.get("fleet_certificates") or {}
        # a confirmation's window outlasts its washout, and each trusted key decodes to an Ed25519 key
        fleet_ok = fleet.get("window_s", 300.0) > fleet.get("washout_s", 60.0) and not fleet.get("trusted_keys")
        return bool(sep and host and port.isdigit() and int(port) <= 65535 and fleet_ok) and not any(
            p.startswith("~") and not p.startswith("~/") and p != "~" for p in paths
        )
    return True


def _yaml_cases(what: str, seeds: list[str]) -> st.SearchStrategy[Case]:
    docs = [yaml.safe_load(s) or {} for s in seeds]

    @st.composite
    def from_schema_doc(draw: st.DrawFn) -> Case:
        doc = draw(_from_schema(what))
        text = _dump_yaml(doc, draw(st.booleans()), draw(st.booleans())).encode()
        valid = what != "rule" and _passes_model_checks(
            what, doc
        )  # a rule's plugin blocks are checked by their plugins
        return Case(text, valid, "from the schema")

    @st.composite
    def mutated(draw: st.DrawFn) -> Case:
        doc = draw(mutated_doc(docs))
        return Case(_dump_yaml(doc, draw(st.booleans()), draw(st.booleans())).encode(), False, "seed, mutated")

    @st.composite
    def damaged_seed(draw: st.DrawFn) -> Case:
        return Case(draw(damaged(draw(st.sampled_from(seeds)).encode(), YAML_ODDITIES)), False, "seed, damaged text")

    return st.one_of(
        st.sampled_from([Case(s.encode(), True, "seed") for s in seeds]),
        from_schema_doc(),
        mutated(),
        mutated(),
        damaged_seed(),
        damaged_seed(),
        st.binary(max_size=200).map(lambda b: Case(b, False, "random bytes")),
    )


def _json_cases(what: str, seeds: list[bytes]) -> st.SearchStrategy[Case]:
    docs = [json.loads(s) for s in seeds]

    @st.composite
    def from_schema_doc(draw: st.DrawFn) -> Case:
        doc = draw(_from_schema(what))
        return Case(json.dumps(doc).encode(), True, "from the schema")

    @st.composite
    def mutated(draw: st.DrawFn) -> Case:
        doc = draw(mutated_doc(docs))
        text = _deepen(json.dumps(doc))  # NaN and Infinity as Python writes them
        return Case(text.encode(), False, "seed, mutated")

    @st.composite
    def damaged_seed(draw: st.DrawFn) -> Case:
        oddities = [
            "[" * 5000,
            '{"a":' * 3000,
            "NaN",
            "-Infinity",
            "1e99999",
            "9" * 5000,
            '"\\ud800"',
            "{}",
            "[]",
            "null",
            '{"state": "run", "seq": "7"}',
            '{"seq": 1e400}',
            '{"__proto__": {}}',
            '{"a": 1, "a": 2}',
        ]
        return Case(draw(damaged(draw(st.sampled_from(seeds)), oddities)), False, "seed, damaged text")

    return st.one_of(
        st.sampled_from([Case(s, True, "seed") for s in seeds]),
        from_schema_doc(),
        mutated(),
        mutated(),
        damaged_seed(),
        st.binary(max_size=100).map(lambda b: Case(b, False, "random bytes")),
    )


def _line_cases(valid_line: Callable[[], st.SearchStrategy[bytes]]) -> st.SearchStrategy[Case]:
    """A followed file: what it held before the source opened it, then lines appended."""
    line = st.one_of(
        valid_line(),
        valid_line(),
        _json_cases("event", event_seeds()).map(lambda c: c.data),
        st.binary(max_size=80),
        # a branch of its own: for a log every other line is taken, so these lines are its
        # only refusals, and the run must reach them
        st.sampled_from([b"x" * (3 << 20), b'{"event": "step_done"' + b" " * 70_000 + b"}"]),
        st.sampled_from(
            [
                b"",
                b"   ",
                b"\r",
                b"[" * 5000,
                b'{"event":' * 2000,
                b"\xff\xfe",
                b'"step_done"',
                b"null",
                b"[]",
            ]
        ),
    )

    @st.composite
    def case(draw: st.DrawFn) -> Case:
        history = b"\n".join(draw(st.lists(line, max_size=3))) + draw(st.sampled_from([b"", b"\n", b"partial"]))
        lines = draw(st.lists(line, min_size=1, max_size=5))
        return Case(b"".join(ln.replace(b"\n", b" ") + b"\n" for ln in lines), False, "lines", history)

    return case()


def _jsonl_valid_line() -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda t, extra: json.dumps({"t": t, "event": "step_done", **extra}).encode(),
        st.floats(0, 2e9),
        st.dictionaries(st.sampled_from(["step", "loss", "event_key"]), st.integers(), max_size=2),
    )


def _log_valid_line() -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda n, pre: f"{pre}step {n} done".encode(), st.integers(0, 10**6), st.sampled_from(["", "INFO ", "é "])
    )


SOCKET_OPS: Mapping[str, list[str]] = MappingProxyType(
    {
        "ping": [],
        "status": [],
        "explain": ["subject"],
        "duty": [],
        "certificates": [],
        "timeline": ["limit", "subject", "code"],
        "job.register": ["manifest", "cmd", "launcher_pid"],
        "job.wait": ["id", "timeout", "unless"],
        "job.started": ["id", "pid"],
        "job.exited": ["id", "exit_code"],
        "job.stop": ["id"],
        "job.pause": ["id"],
        "job.resume": ["id"],
        "ab.status": [],
        "ab.show": ["id"],
        "ab.plan": ["rule", "off", "duty", "window", "washout", "blocks", "margin", "max_hours"],
        "ab.start": ["rule", "window", "washout", "sweep", "levels"],
        "ab.sweep": ["rule", "levels"],
        "ab.abort": ["id"],
    }
)
#: left out: they wait on probe processes for up to 45 s each (gpu-apis, doctor) or reload rules
SLOW_OPS = ("gpu-apis", "doctor", "reload")
LIVE_JOB = "{live}"  # stands for the id of a job the harness keeps registered


def _socket_value(name: str) -> st.SearchStrategy[Any]:
    plausible: dict[str, st.SearchStrategy[Any]] = {
        "id": st.sampled_from([LIVE_JOB, LIVE_JOB, "nosuch", "", "ab-1"]),
        "manifest": st.one_of(st.sampled_from([yaml.safe_load(s) for s in manifest_seeds()]), _from_schema("manifest")),
        "cmd": st.sampled_from([["true"], ["python", "-c", "pass"], [], ["a", 3], "true"]),
        "timeout": st.sampled_from([0, 0.01, -1, 0.05]),
        "limit": st.integers(-5, 20_000),
        "subject": st.sampled_from(["node", "nosuch", ""]),
        "code": st.sampled_from(["JOB_PAUSED", ""]),
        "pid": st.sampled_from([1, os.getpid(), 0, -1, 2**40]),
        "exit_code": st.integers(-300, 300),
        "rule": st.sampled_from(["llm-server", "nosuch", ""]),
        "off": st.sampled_from(["paused", "evicted", "frozen"]),
        "levels": st.sampled_from([[0.1, 0.2], [0.2, 0.1], [], "0.1", [2]]),
    }
    return st.one_of(plausible.get(name, st.floats(-10, 1e5)), weird_values())


@st.composite
def _socket_request(draw: st.DrawFn) -> Case:
    op = draw(
        st.one_of(
            *[st.sampled_from(sorted(SOCKET_OPS))] * 4,
            st.sampled_from(["", "PING", "job.", "ab.nosuch", "../x"]),
            st.text(max_size=10),
        )
    )
    names = SOCKET_OPS.get(op, [])
    args = {n: draw(_socket_value(n)) for n in names if draw(st.integers(0, 3))}
    if draw(st.integers(0, 4)) == 0:
        args[draw(st.sampled_from(["op", "extra", "", "id"]))] = draw(weird_values())
    request: Any = {"op": op, **args}
    if draw(st.integers(0, 9)) == 0:
        request = draw(st.sampled_from([{"op": 3}, {"op": None}, {}, [op], op, 3, None, True]))
    try:
        text = json.dumps(request).encode()
    except (ValueError, RecursionError):
        text = b"[" * 5000
    if draw(st.integers(0, 5)) == 0:
        text = draw(damaged(text, ["[" * 5000, '{"op": "ping"}', "{", "null", "\x00"]))
    return Case(text.replace(b"\n", b" ") + b"\n", False, "request", (op, sorted(args)))


HTTP_PATHS = (
    "/healthz",
    "/v1/status",
    "/v1/explain",
    "/v1/timeline",
    "/v1/gpu-apis",
    "/v1/duty",
    "/v1/ab",
    "/v1/ab/ab-1",
    "/v1/ab/nosuch",
    "/v1/ab/ab-1/plot",
    "/v1/reload",
    "/v1/nosuch",
    "/v1/ab/%00",
    "/v1/ab/..%2f..",
    "/v1//status",
    "/openapi.json",
)


@st.composite
def _http_request(draw: st.DrawFn) -> Case:
    method = draw(st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]))
    path = draw(
        st.one_of(
            st.sampled_from(HTTP_PATHS),
            st.builds(
                lambda s: "/v1/ab/" + s,
                st.text(string.ascii_letters + string.digits + "-._~%/?#[]@!$&'()*+,;= ", max_size=20),
            ),
        )
    )
    value = st.one_of(
        st.text(max_size=20),
        st.sampled_from(["-1", "0", "1", "10000", "10001", "1e3", "nan", "", "9" * 400]),
        st.lists(st.text(max_size=5), max_size=3),
    )
    params = draw(st.dictionaries(st.sampled_from(["limit", "subject", "code", "x", ""]), value, max_size=3))
    host = draw(
        st.sampled_from(["127.0.0.1:7807", "localhost", "[::1]:7807", "evil.example", "127.0.0.1.nip.io", "", "[::1"])
    )
    auth = draw(st.sampled_from([None, "Bearer s3cret", "Bearer wrong", "Basic x", "Bearer ", "s3cret"]))
    body = draw(st.one_of(st.none(), st.binary(max_size=50), st.sampled_from([b"{}", b"[" * 5000, b'{"a":1}'])))
    return Case(body or b"", False, "request", (method, path, params, host, auth, body is not None))


def cases(fmt: str) -> st.SearchStrategy[Case]:
    _mend_hypothesis_jsonschema()
    if fmt == "rule":
        return _yaml_cases("rule", rule_seeds())
    if fmt == "node":
        return _yaml_cases("node", node_seeds())
    if fmt == "manifest":
        return _yaml_cases("manifest", manifest_seeds())
    if fmt == "control":
        return _json_cases("control", control_seeds())
    if fmt == "event":
        return _json_cases("event", event_seeds())
    if fmt == "jsonl":
        return _line_cases(_jsonl_valid_line)
    if fmt == "log":
        return _line_cases(_log_valid_line)
    if fmt == "socket":
        return _socket_request()
    if fmt == "http":
        return _http_request()
    raise KeyError(fmt)


# --- feeding them through the real entry points ---------------------------------------------------


def _located(problem: Any, path: str) -> bool:
    return problem.file == path and (problem.line >= 1 or bool(problem.field))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _crash(exc: BaseException) -> Verdict:
    return Verdict("crash", f"{type(exc).__name__}: {str(exc)[:300]}")


#: root-level pydantic errors that are about the line as a whole (its loc is empty)
_WHOLE_LINE = (
    "json_invalid",
    "json_type",
    "model_type",
    "model_attributes_type",
    "dict_type",
    "union_tag_not_found",
    "union_tag_invalid",
    "recursion_loop",
)


class StubProvider:
    """What the HTTP app reads, without a daemon."""

    token = "s3cret"

    def status(self) -> dict[str, Any]:
        return {"version": "x", "gpu_jobs": "never", "rules": [], "jobs": []}

    def explain(self, subject: str | None) -> dict[str, Any]:
        if subject not in (None, "node"):
            raise LookupError(f"no job or tenant is called {subject!r}")
        return {"subject": "node", "items": []}

    def timeline(self, limit: int, subject: str | None, code: str | None) -> list[dict[str, Any]]:
        assert isinstance(limit, int) and 1 <= limit <= 10_000
        return []

    def reload(self) -> None:
        pass

    def gpu_apis(self) -> dict[str, Any]:
        return {"host": [], "containers": []}

    def duty(self) -> dict[str, Any]:
        return {"summary": "no governor runs"}

    def ab_status(self) -> list[dict[str, Any]]:
        return []

    def ab_show(self, run_id: str) -> dict[str, Any]:
        if run_id != "ab-1":
            raise LookupError(f"no run {run_id!r}")
        return {"run": "ab-1"}

    def ab_plot(self, run_id: str) -> bytes:
        self.ab_show(run_id)
        return b"\x89PNG\r\n\x1a\n"

    def metrics(self) -> dict[str, Any]:
        return {}


@dataclass
class Harness:
    """The entry points, set up once: a tenants dir, a plugin host, a daemon, an HTTP app."""

    root: Path
    _host: Any = None
    _daemon: Any = None
    _live_job: str = ""
    _client: Any = None
    _sources: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    # each format's entry point

    def feed(self, fmt: str, case: Case) -> Verdict:
        try:
            verdict: Verdict = getattr(self, f"_feed_{fmt}")(case)
            return verdict
        except Exception as exc:
            return _crash(exc)

    @property
    def host(self) -> Any:
        if self._host is None:
            from arbiter.pluginmanager import build_plugin_manager

            self._host = build_plugin_manager()
        return self._host

    def _feed_rule(self, case: Case) -> Verdict:
        from arbiter.config.loader import check_paths

        path = self.root / "rules" / "tenants.d" / "fuzz.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(case.data)
        # as `arbiter check FILE` does: judged beside the tenants dirs (here the shipped rule files);
        # only a file that may build on one needs them, and reading them costs most of the time
        bases = [ROOT / "tenants.d"] if b"extends" in case.data else []
        ruleset = check_paths([path], self.host.options_model, self.host.kind_names, bases=bases)
        problems = [p for ps in ruleset.problems.values() for p in ps]
        if not problems:
            return Verdict("accepted") if ruleset.rules else Verdict("crash", "neither a rule nor a problem")
        files = {str(path), *(str(p) for p in (ROOT / "tenants.d").glob("*.yaml"))}
        unlocated = [p for p in problems if p.file not in files or not (p.line >= 1 or p.field)]
        if unlocated:
            return Verdict("unlocated", str(unlocated[0]))
        if case.valid:
            return Verdict("wrong_reject", str(problems[0]))
        return Verdict("rejected", str(problems[0]))

    def _feed_node(self, case: Case) -> Verdict:
        from arbiter.config.errors import ConfigError
        from arbiter.config.loader import load_node_config

        path = self.root / "node" / "arbiter.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(case.data)
        try:
            config, found = load_node_config(path)
        except ConfigError as exc:
            return self._judge(exc.problems, str(path), case)
        if found != path or not Path(config.state_dir).is_absolute():
            return Verdict("crash", f"loaded from {found}, state_dir {config.state_dir!r}")
        return Verdict("accepted")

    def _judge(self, problems: list[Any], path: str, case: Case) -> Verdict:
        bad = [p for p in problems if not _located(p, path)]
        if not problems or bad:
            return Verdict("unlocated", str(bad[0]) if bad else "no problems listed")
        return Verdict("wrong_reject" if case.valid else "rejected", str(problems[0]))

    def _feed_manifest(self, case: Case) -> Verdict:
        from arbiter.cli.client import CliError
        from arbiter.cli.jobrun import build_manifest
        from arbiter.config.errors import ConfigError
        from arbiter.config.jobdocs import Manifest
        from arbiter.config.loader import parse_manifest, read_text

        path = self.root / "job.yaml"
        path.write_bytes(case.data)
        try:
            manifest = build_manifest(["true"], None, str(path), cooperative=bool(len(case.data) % 2))
        except CliError as exc:
            try:
                parse_manifest(read_text(path), str(path))
            except ConfigError as again:
                if str(again) not in str(exc):
                    return Verdict("unlocated", f"the CLI says {exc}")
                return self._judge(again.problems, str(path), case)
            return Verdict("crash", f"refused by the CLI, taken by the loader: {exc}")
        Manifest.model_validate(manifest)  # what the daemon does with it (job.register)
        return Verdict("accepted")

    def _feed_control(self, case: Case) -> Verdict:
        from arbiter.sdk.control import STATES, Control, read_control_document

        path = self.root / "control.json"
        path.write_bytes(case.data)
        try:  # a job's side: nothing may propagate
            doc = read_control_document(str(path))
            ctl = Control(path=str(path), install_handler=False)
        except BaseException as exc:
            return _crash(exc)
        sane = (
            ctl.state in STATES
            and isinstance(ctl.seq, int)
            and isinstance(ctl.reason, str)
            and 0.0 <= ctl.gpu_duty <= 1.0
        )
        if not sane:
            return Verdict("crash", f"the job took state={ctl.state!r} seq={ctl.seq!r} duty={ctl.gpu_duty!r}")
        # the published schema is the contract (the model is laxer: it takes true for 1), over
        # strict JSON: UTF-8, and no NaN or Infinity, which a schema's bounds let through
        try:
            model_ok = _schema_valid("control", json.loads(case.data.decode("utf-8-sig"), parse_constant=_no_constant))
        except (ValueError, RecursionError):
            model_ok = False
        if doc is None:
            # a document the schema says is good must be obeyed
            return (
                Verdict("wrong_reject", "the SDK ignored a valid document")
                if model_ok
                else Verdict("rejected", "ignored")
            )
        if model_ok and ctl.seq != doc["seq"]:
            return Verdict("crash", f"read seq {doc['seq']!r} but the job holds {ctl.seq!r}")
        return Verdict("accepted")

    def _feed_event(self, case: Case) -> Verdict:
        from arbiter.config.jobdocs import JobEvent

        try:
            JobEvent.model_validate_json(case.data)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            bad = [e for e in errors if not e["loc"] and e["type"] not in _WHOLE_LINE]
            if not errors or bad:
                return Verdict("unlocated", str(bad[0] if bad else exc)[:300])
            return self._read_by_daemon(case.data, False) or Verdict(
                "wrong_reject" if case.valid else "rejected", str(errors[0])[:300]
            )
        return self._read_by_daemon(case.data, True) or Verdict("accepted")

    def _read_by_daemon(self, data: bytes, valid: bool) -> Verdict | None:
        """The line as the daemon reads it from a job's events file: taken when the model
        takes it, else counted and named by file and line.  None when it agrees."""
        from arbiter.daemon.jobevents import MAX_LINE_BYTES, JobEventLog

        if b"\n" in data or not data.strip() or len(data) > MAX_LINE_BYTES:
            return None  # not one line of a file
        path = self.root / "job-events.jsonl"
        path.write_bytes(data + b"\n")
        report = JobEventLog().read({"job": str(path)})["job"]
        if valid and report.lines != 1:
            return Verdict("wrong_reject", f"the daemon refused a line the schema takes: {report.problem}"[:300])
        if not valid and (report.malformed != 1 or f"{path} line 1: " not in report.problem):
            return Verdict("unlocated", f"the daemon did not name the bad line: {report}"[:300])
        return None

    def _follow(self, case: Case, make: Callable[[str], Any], expect: Callable[[bytes], tuple[bool, bool]]) -> Verdict:
        from arbiter_sources.follow import MAX_LINE_BYTES

        path = self.root / "followed" / "events.jsonl"
        if path.parent.exists():
            shutil.rmtree(path.parent)
        path.parent.mkdir()
        path.write_bytes(case.extra)
        source = make(str(path))
        try:
            source.state()  # opens it: what it held is history, not progress
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, case.data)
            finally:
                os.close(fd)
            after = source.state()
        finally:
            source.close()
        want_count = want_bad = 0
        partial = not case.extra.endswith(b"\n") and case.extra
        lines = case.data.split(b"\n")[:-1]
        if partial:  # the history's unfinished last line is finished by the first line appended
            lines[0] = case.extra.rsplit(b"\n", 1)[-1] + lines[0]
        for raw in lines:
            line = raw.strip()
            if len(raw) > MAX_LINE_BYTES:
                want_bad += 1
            elif line:
                matched, bad = expect(line)
                want_count += matched
                want_bad += bad
        got_count, got_bad = after.count, source.malformed
        if not after.readable or (got_count, got_bad) != (want_count, want_bad):
            return Verdict(
                "crash",
                f"readable={after.readable} ({after.why}); counted {got_count} and skipped {got_bad}, "
                f"not {want_count} and {want_bad}",
            )
        return Verdict("rejected", f"{got_bad} skipped") if got_bad else Verdict("accepted")

    def _feed_jsonl(self, case: Case) -> Verdict:
        from arbiter.plugin import PluginContext
        from arbiter_sources import JsonlSource

        def make(path: str) -> Any:
            return JsonlSource(
                JsonlSource.Options.model_validate({"kind": "jsonl", "path": path, "event": "step_done"}),
                PluginContext(state_dir=self.root),
            )

        def expect(line: bytes) -> tuple[bool, bool]:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                return False, True
            if not isinstance(obj, dict):
                return False, True
            return obj.get("event") == "step_done", False

        verdict = self._follow(case, make, expect)
        if verdict.outcome != "crash":  # the phase forms read the same lines another way
            for block in (
                {"event": "status", "field": "state.phase", "on": ["uploading"]},
                {"enter": "step_done", "exit": "x"},
            ):
                src = JsonlSource(
                    JsonlSource.Options.model_validate(
                        {"kind": "jsonl", "path": str(self.root / "followed" / "p.jsonl"), **block}
                    ),
                    PluginContext(state_dir=self.root),
                )
                (self.root / "followed" / "p.jsonl").write_bytes(case.extra + case.data)
                try:
                    if not src.state().readable:
                        return Verdict("crash", f"phase form {block}: {src.state().why}")
                finally:
                    src.close()
        return verdict

    def _feed_log(self, case: Case) -> Verdict:
        from arbiter.plugin import PluginContext
        from arbiter_sources import LogSource

        regex = re.compile(r"step \d+ done")

        def make(path: str) -> Any:
            return LogSource(
                LogSource.Options.model_validate({"kind": "log", "path": path, "log_regex": regex.pattern}),
                PluginContext(state_dir=self.root),
            )

        return self._follow(case, make, lambda line: (regex.search(line.decode("utf-8", "replace")) is not None, False))

    # the daemon's socket

    def daemon(self) -> Any:
        if self._daemon is None:
            from arbiter.config.models import NodeConfig
            from arbiter.daemon.core import Daemon

            tenants = self.root / "daemon" / "tenants.d"
            tenants.mkdir(parents=True, exist_ok=True)
            config = NodeConfig(
                state_dir=str(self.root / "daemon" / "state"),
                tenants_dirs=[str(tenants)],
                readers=["cpu_time"],
                stand_in_gpu=True,
                tick_s=0.5,
                http={"enabled": False},
            )
            self._daemon = Daemon(config)
            self._daemon.start()
            self._live_job = self._register("live")
        return self._daemon

    def _register(self, name: str) -> str:
        answer = self._ask(
            json.dumps(
                {"op": "job.register", "manifest": {"name": name, "gpu": {"use": "none"}}, "cmd": ["true"]}
            ).encode()
            + b"\n"
        )
        return str(answer["job"]["id"])

    def _ask(self, line: bytes) -> Any:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        try:
            sock.connect(str(self._daemon.state_dir / "arbiter.sock"))
            sock.sendall(line)
            with sock.makefile("rb") as fh:
                answer = fh.readline()
        finally:
            sock.close()
        return json.loads(answer) if answer else None

    def _feed_socket(self, case: Case) -> Verdict:
        daemon = self.daemon()
        if daemon.jobs.get(self._live_job) is None:  # an earlier request stopped it
            self._live_job = self._register("live")
        op, arg_names = case.extra
        line = case.data.replace(json.dumps(LIVE_JOB).encode(), json.dumps(self._live_job).encode())
        answer = self._ask(line)
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            return Verdict("crash", f"answer {answer!r}")
        job = answer.get("job")
        if answer["ok"] and isinstance(job, dict):  # registered one: end it, so jobs do not pile up
            self._ask(json.dumps({"op": "job.exited", "id": job["id"], "exit_code": 0}).encode() + b"\n")
        if answer["ok"]:
            return Verdict("accepted")
        error, code = str(answer.get("error", "")), answer.get("code")
        if code == "INTERNAL":
            return Verdict("crash", error)
        names = [str(op), *arg_names, *SOCKET_OPS.get(str(op), []), "request", "job", "run", "rule"]
        if not error or not any(n and n in error for n in names):
            return Verdict("unlocated", f"{code}: {error}")
        return Verdict("rejected", f"{code}: {error}"[:300])

    # the HTTP app

    def _feed_http(self, case: Case) -> Verdict:
        if self._client is None:
            from fastapi.testclient import TestClient

            from arbiter.http.app import create_app

            self._client = TestClient(
                create_app(StubProvider()), base_url="http://127.0.0.1:7807", raise_server_exceptions=True
            )
        method, path, params, host, auth, with_body = case.extra
        headers = {"host": host} if host else {}
        if auth is not None:
            headers["authorization"] = auth
        response = self._client.request(
            method, path, params=params, headers=headers, content=case.data if with_body else None
        )
        if response.status_code >= 500:
            return Verdict("crash", f"{response.status_code}: {response.text[:200]}")
        if response.status_code < 400:
            return Verdict("accepted")
        if method == "HEAD":  # no body to say why
            return Verdict("rejected", str(response.status_code))
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = None
        if response.status_code == 422:
            if not isinstance(detail, list) or not all(isinstance(d, dict) and d.get("loc") for d in detail):
                return Verdict("unlocated", response.text[:200])
        elif not detail:
            return Verdict("unlocated", f"{response.status_code}: {response.text[:200]}")
        return Verdict("rejected", f"{response.status_code}: {str(detail)[:200]}")

    def close(self) -> None:
        if self._daemon is not None:
            self._daemon.request_stop()
            self._daemon.shutdown()
            self._daemon = None
        if self._client is not None:
            self._client.close()
