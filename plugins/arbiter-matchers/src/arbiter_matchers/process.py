"""The ``process`` matcher: selects processes by name, command line, executable, the script or
module an interpreter runs, working directory and user."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from arbiter.plugin import KindOptions, Matcher, ProcessInfo

try:
    import pwd
except ImportError:  # pragma: no cover - not a POSIX host: user names resolve per process only
    pwd = None  # type: ignore[assignment]

_SELECTORS = ("name", "cmdline", "cmdline_endswith", "path_prefix", "script", "module", "cwd")


class ProcessOptions(KindOptions):
    """A rule's ``match:`` block for ``kind: process``.

    Every field given must match (AND); within one field any entry may match (OR).
    """

    kind: Literal["process"] = "process"
    name: list[str] = Field([], description="process names, whole and ignoring case")
    cmdline: list[str] = Field(
        [], description="text found anywhere in the command line (its arguments joined by spaces), ignoring case"
    )
    cmdline_endswith: list[str] = Field([], description="text the command line ends with, ignoring case")
    path_prefix: list[str] = Field(
        [], description="path prefixes of the executable (~ expands for the daemon's account)"
    )
    script: list[str] = Field(
        [],
        description=(
            "a file among its arguments, as an interpreter is given its script: an argument that, taken from "
            "its working directory where it is relative, is it or ends with /it, ignoring case (main.py; "
            "ComfyUI/main.py matches both `python ComfyUI/main.py` and `cd ComfyUI && python main.py`)"
        ),
    )
    module: list[str] = Field(
        [],
        description=(
            "a Python module it runs with -m, or a package above it (vllm matches -m vllm.entrypoints.openai.api_server)"
        ),
    )
    cwd: list[str] = Field(
        [],
        description=(
            "its working directory: a path prefix (absolute or ~), or a folder name it is in or under, ignoring "
            "case (ComfyUI, for `cd ComfyUI && python main.py`); a directory it cannot read does not match"
        ),
    )
    user: list[str] = Field([], description="user names or uids the process runs as (its real uid)")
    tree: Literal["process", "descendants"] = Field(
        "process", description="descendants: the rule's processes are the matching ones and every process they start"
    )

    @field_validator(
        "name", "cmdline", "cmdline_endswith", "path_prefix", "script", "module", "cwd", "user", mode="before"
    )
    @classmethod
    def _one_is_a_list(cls, value: Any) -> Any:
        # `name: ollama` in a rule file means `name: [ollama]`; YAML also reads `user: [1000]`
        # as integers, which are uids here.
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("name", "cmdline", "cmdline_endswith", "path_prefix", "script", "module", "cwd", "user")
    @classmethod
    def _no_empty_entries(cls, value: list[str]) -> list[str]:
        # An empty string would match every process (a substring of everything).
        if any(not v.strip() for v in value):
            raise ValueError("entries must not be empty (an empty entry would match every process)")
        return value

    @model_validator(mode="after")
    def _needs_a_selector(self) -> ProcessOptions:
        if not any(getattr(self, f) for f in _SELECTORS):
            raise ValueError(
                "a process match needs at least one of "
                + ", ".join(_SELECTORS)
                + " (user and tree only narrow or widen what those select)"
            )
        return self


class ProcessMatcher(Matcher):
    """Selects the processes a ``match:`` block names, optionally with their descendants."""

    Options = ProcessOptions

    def __init__(self, options: ProcessOptions) -> None:
        super().__init__(options)
        self._names = frozenset(n.lower() for n in options.name)
        self._substrings = tuple(c.lower() for c in options.cmdline)
        self._suffixes = tuple(c.lower() for c in options.cmdline_endswith)
        # Expanded once, for the account the daemon runs as.
        self._prefixes = tuple(os.path.expanduser(p) for p in options.path_prefix)
        self._scripts = tuple(s.replace("\\", "/").lower() for s in options.script)
        self._script_tails = tuple("/" + s.lstrip("/") for s in self._scripts)
        self._script_names = frozenset(s.rsplit("/", 1)[-1] for s in self._scripts)
        self._modules = tuple(options.module)
        self._cwd_prefixes = tuple(os.path.expanduser(c).rstrip("/") for c in options.cwd if _is_path(c))
        self._cwd_names = frozenset(c.lower() for c in options.cwd if not _is_path(c))
        self._uids, self._usernames = _resolve_users(options.user)
        self._descendants = options.tree == "descendants"
        self.judges_each_process = not self._descendants  # descendants are found through other processes
        # pid → the ProcessInfo last judged, and the pids judged to match: the process
        # table hands back the very same object for a process that did not change (an
        # equal one for a process that only ran), and a verdict depends on nothing else, so
        # with a hundred rules and a thousand processes most ticks judge no one anew.  Two
        # flat containers, not a (process, verdict) pair per pid: every small tuple is one
        # more object for each full garbage collection to walk, and a collection holds
        # every thread, the fast path's too.
        self._judged: dict[int, ProcessInfo] = {}
        self._hits: set[int] = set()
        self._widest = 0  # the most processes one call offered

    def select(self, processes: Sequence[ProcessInfo]) -> set[int]:
        judged, hits = self._judged, self._hits
        self._widest = max(self._widest, len(processes))
        # forget the pids that are gone, from a call offered about every process (the daemon
        # offers most calls only the processes that changed: those say nothing of the rest)
        if 2 * len(processes) >= self._widest and len(judged) > 2 * len(processes) + 64:
            listed = {p.pid for p in processes}
            judged = self._judged = {pid: p for pid, p in judged.items() if pid in listed}
            hits &= listed
        get, matches = judged.get, self._matches
        selected: set[int] = set()
        for p in processes:
            pid = p.pid
            before = get(pid)
            if before is not p:
                judged[pid] = p
                if before != p:  # an equal one only ran: its verdict stands
                    if matches(p):
                        hits.add(pid)
                    else:
                        hits.discard(pid)
            if pid in hits:
                selected.add(pid)
        if self._descendants and selected:
            selected = _with_descendants(selected, processes)
        # The daemon must never pause or signal itself, whatever a rule says.
        selected.discard(os.getpid())
        return selected

    def examples(self) -> list[ProcessInfo]:
        """One process per entry of its longest selector, each with the first entry of every
        other (every field must match); a working directory cannot be made up, so a match on
        one gives examples that it does not select itself."""
        o = self.options
        assert isinstance(o, ProcessOptions)
        fields = [o.name, o.cmdline, o.cmdline_endswith, o.path_prefix, o.script, o.module, o.user]
        out = []
        for i in range(max(len(f) for f in fields)):

            def pick(entries: list[str], i: int = i) -> str:
                return entries[min(i, len(entries) - 1)] if entries else ""

            name = pick(o.name) or ("python3" if o.module or o.script else (pick(o.cmdline).split() or ["program"])[0])
            exe = f"{pick(o.path_prefix).rstrip('/') or '/usr/bin'}/{name}"
            argv = [exe]
            if o.module:
                argv += ["-m", pick(o.module)]
            if o.script:
                argv.append("/opt/" + pick(o.script).lstrip("/"))
            argv += pick(o.cmdline).split()
            argv += pick(o.cmdline_endswith).split()
            user = pick(o.user)
            out.append(
                ProcessInfo(
                    0,
                    0,
                    name=name,
                    exe=exe,
                    cmdline=tuple(argv),
                    uid=int(user) if user.isdigit() else -1,
                    username="" if user.isdigit() else user,
                )
            )
        return out

    def _matches(self, p: ProcessInfo) -> bool:
        if self._names and p.name.lower() not in self._names:
            return False
        if self._substrings or self._suffixes:
            joined = " ".join(p.cmdline).lower()
            if self._substrings and not any(s in joined for s in self._substrings):
                return False
            if self._suffixes and not joined.endswith(self._suffixes):
                return False
        if self._prefixes:
            exe = p.exe
            if not exe and p.cmdline and os.path.isabs(p.cmdline[0]):
                # The executable link of another user's process is unreadable without
                # ptrace rights, while its command line is not; argv[0] is the best we have.
                exe = p.cmdline[0]
            if not exe or not exe.startswith(self._prefixes):
                return False
        if self._scripts and not self._runs_script(p):
            return False
        if self._modules and not any(_runs_module(m, self._modules) for m in _modules_run(p.cmdline)):
            return False
        if (self._cwd_prefixes or self._cwd_names) and not self._in_cwd(p.pid):
            return False
        # where users are named, the process must be one of theirs
        return not (self._uids or self._usernames) or p.uid in self._uids or p.username in self._usernames

    def misses(self, process: ProcessInfo) -> list[str]:
        o, p = self.options, process
        assert isinstance(o, ProcessOptions)
        joined = " ".join(p.cmdline)
        shown = joined if len(joined) <= 80 else joined[:77] + "..."
        out = []
        if self._names and p.name.lower() not in self._names:
            out.append(f"name: {p.name!r} is not {_either(o.name)}")
        if self._substrings and not any(s in joined.lower() for s in self._substrings):
            out.append(f"cmdline: no {_either(o.cmdline)} in {shown!r}")
        if self._suffixes and not joined.lower().endswith(self._suffixes):
            out.append(f"cmdline_endswith: {shown!r} does not end with {_either(o.cmdline_endswith)}")
        if self._prefixes:
            exe = p.exe or (p.cmdline[0] if p.cmdline and os.path.isabs(p.cmdline[0]) else "")
            if not exe.startswith(self._prefixes):
                out.append(
                    f"path_prefix: its executable {exe or '(unreadable)'!r} is not under {_either(o.path_prefix)}"
                )
        if self._scripts and not self._runs_script(p):
            out.append(f"script: it runs no {_either(o.script)} (arguments {p.cmdline[1:]!r}, cwd {_cwd_of(p.pid)!r})")
        if self._modules and not any(_runs_module(m, self._modules) for m in _modules_run(p.cmdline)):
            out.append(f"module: it runs no {_either(o.module)} with -m")
        if (self._cwd_prefixes or self._cwd_names) and not self._in_cwd(p.pid):
            out.append(f"cwd: its working directory {_cwd_of(p.pid) or '(unreadable)'!r} is not {_either(o.cwd)}")
        if (self._uids or self._usernames) and not (p.uid in self._uids or p.username in self._usernames):
            out.append(f"user: it runs as {p.username or p.uid!r}, not {_either(o.user)}")
        return out

    def _runs_script(self, p: ProcessInfo) -> bool:
        relative = []
        for raw in p.cmdline[1:]:
            arg = raw.replace("\\", "/").lower()  # a Windows launch writes ComfyUI\main.py
            if arg in self._scripts or arg.endswith(self._script_tails):
                return True
            if not arg.startswith("/") and arg.rsplit("/", 1)[-1] in self._script_names:
                relative.append(arg)
        if not relative:
            return False
        cwd = _cwd_of(p.pid)  # read only for an argument that names one of the scripts
        if cwd is None:
            return False
        base = cwd.replace("\\", "/").lower().rstrip("/")
        return any(f"{base}/{arg}".endswith(self._script_tails) for arg in relative)

    def _in_cwd(self, pid: int) -> bool:
        """Read last, and only for a process every other selector took: it is one more
        look at the process that the table does not carry."""
        cwd = _cwd_of(pid)
        if cwd is None:
            return False
        if any(cwd == c or cwd.startswith(c + "/") for c in self._cwd_prefixes):
            return True
        return any(part.lower() in self._cwd_names for part in cwd.split("/") if part)


def _either(values: list[str]) -> str:
    return " or ".join(repr(v) for v in values)


def _is_path(entry: str) -> bool:
    return entry.startswith(("/", "~"))


def _modules_run(cmdline: Sequence[str]) -> list[str]:
    """What ``-m MODULE`` (or ``-mMODULE``) names among the arguments."""
    out = []
    for i, arg in enumerate(cmdline[1:], start=1):
        if arg == "-m" and i + 1 < len(cmdline):
            out.append(cmdline[i + 1])
        elif arg.startswith("-m") and len(arg) > 2 and not arg.startswith("--"):
            out.append(arg[2:])
    return out


def _runs_module(module: str, wanted: Sequence[str]) -> bool:
    return any(module == w or module.startswith(w + ".") for w in wanted)


def _cwd_of(pid: int) -> str | None:
    """Its working directory, or None where it cannot be read (another user's process
    without the rights to look, or one that has exited)."""
    try:
        import psutil

        return str(psutil.Process(pid).cwd())
    except Exception:  # psutil's errors, and a platform that cannot say
        return None


def _resolve_users(users: list[str]) -> tuple[frozenset[int], frozenset[str]]:
    """Split ``user`` entries into uids and names; a name known to this host also gives its uid,
    so a process whose user name could not be read still matches by uid."""
    uids: set[int] = set()
    names: set[str] = set()
    for entry in users:
        entry = entry.strip()
        if entry.isdigit():
            uids.add(int(entry))
            continue
        names.add(entry)
        if pwd is not None:
            try:
                uids.add(pwd.getpwnam(entry).pw_uid)
            except KeyError:
                pass
    return frozenset(uids), frozenset(names)


def _with_descendants(roots: set[int], processes: Sequence[ProcessInfo]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in processes:
        if p.pid != p.ppid:  # pid 0 is its own parent on some hosts
            children.setdefault(p.ppid, []).append(p.pid)
    result = set(roots)
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in result:
                result.add(child)
                stack.append(child)
    return result
