"""How the daemon's operations are declared, who may call them, and their arguments checked.

:func:`operation` marks a method of :class:`arbiter.daemon.api.NodeApi` as the operation it
carries out and who may call it; :func:`declared` reads the table back from the class, once,
with each method's parameters: its typed request (text, numbers, whole numbers, flags, a
list of text, a mapping), checked by :func:`arguments` before the method runs.  Two names are
given by the table rather than the caller: ``caller`` (who asks) and ``job`` (the job the
request's ``id`` names, once the caller's right to it is checked).
"""

from __future__ import annotations

import grp
import inspect
import math
import pwd
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from arbiter.api.ops import Op, Who

F = TypeVar("F", bound=Callable[..., Any])


class Refused(Exception):
    """A request the daemon does not carry out: its code and a message the caller can act on."""

    def __init__(self, message: str, code: str = "REFUSED") -> None:
        self.code = code
        super().__init__(message)


class RunNotFound(Refused, LookupError):
    """No paired run has the id asked for (the HTTP listener answers 404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "AB_REFUSED")


@dataclass(frozen=True)
class Declared:
    op: Op
    who: Who
    #: the answer's one field the method's value goes in; None: the method returns the fields
    answer: str | None
    #: for the job's owner: the request's ``id`` may also be the name of one running job
    by_name: bool = False


def operation(op: Op, who: Who, answer: str | None = None, by_name: bool = False) -> Callable[[F], F]:
    """Declare a method of :class:`NodeApi` the operation ``op``, callable by ``who``."""

    def declare(fn: F) -> F:
        fn.__arbiter_op__ = Declared(op, who, answer, by_name)  # type: ignore[attr-defined]
        return fn

    return declare


#: a parameter the caller gives: its name, its type, whether it may be left out
Param = tuple[str, Any, bool]
#: parameters the table gives: who asks, and the job the request's ``id`` names
GIVEN = ("self", "caller", "job")


@dataclass(frozen=True)
class Entry:
    declared: Declared
    method: Callable[..., Any]
    params: tuple[Param, ...]
    wants_caller: bool
    #: the method takes the request's other arguments as they are (``**settings``)
    takes_rest: bool


def declared(cls: type) -> dict[Op, Entry]:
    """Every operation ``cls`` declares, with its method and the parameters its caller gives."""
    out: dict[Op, Entry] = {}
    for _, fn in inspect.getmembers(cls, inspect.isfunction):
        decl = getattr(fn, "__arbiter_op__", None)
        if not isinstance(decl, Declared):
            continue
        hints = typing.get_type_hints(fn)
        signature = inspect.signature(fn).parameters
        named = {n: p for n, p in signature.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        params = tuple(
            (name, hints[name], p.default is not inspect.Parameter.empty)
            for name, p in named.items()
            if name not in GIVEN
        )
        out[decl.op] = Entry(decl, fn, params, "caller" in signature, len(named) < len(signature))
    return out


def group_members(group: str) -> set[int]:
    """uids in ``group`` (as primary or supplementary group); empty when it does not exist."""
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    uids = {p.pw_uid for p in pwd.getpwall() if p.pw_gid == g.gr_gid}
    for name in g.gr_mem:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return uids


def may_act_on_job(peer_uid: int, owner_uid: int, daemon_uid: int) -> bool:
    return peer_uid in (0, daemon_uid, owner_uid)


def may_admin(peer_uid: int, daemon_uid: int, admin_uids: set[int]) -> bool:
    return peer_uid in (0, daemon_uid) or peer_uid in admin_uids


def _number(op: str, name: str, value: Any, whole: bool) -> float:
    if isinstance(value, str):
        try:
            value = float(value)  # the CLI may pass what the user typed
        except ValueError:
            pass
    kind = "a whole number" if whole else "a number"
    try:
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        raise Refused(f"{op}: argument {name!r} must be {kind}, not {value!r}"[:300], "BAD_REQUEST")
    if whole:
        if value != int(value) or abs(value) >= 2**63:  # what SQLite stores
            raise Refused(
                f"{op}: argument {name!r} must be {kind} of at most 63 bits, not {value!r}"[:300], "BAD_REQUEST"
            )
        return int(value)
    return float(value)


def _argument(op: str, name: str, hint: Any, value: Any) -> Any:
    """``value`` as the parameter's type says, or :class:`Refused` naming the argument."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        inner = [h for h in typing.get_args(hint) if h is not type(None)]
        optional, hint = True, inner[0]
    if value is None and optional:
        return None
    if hint is str:
        if isinstance(value, str):
            return value
        raise Refused(f"{op}: argument {name!r} must be text, not {type(value).__name__}", "BAD_REQUEST")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise Refused(f"{op}: argument {name!r} must be true or false, not {value!r}"[:300], "BAD_REQUEST")
    if hint in (int, float):
        return _number(op, name, value, whole=hint is int)
    origin = typing.get_origin(hint)
    if origin is list:
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value
        raise Refused(f"{op}: argument {name!r} must be a non-empty list of text", "BAD_REQUEST")
    if origin is dict:
        if isinstance(value, dict):
            return value
        raise Refused(f"{op}: argument {name!r} must be a mapping", "BAD_REQUEST")
    raise TypeError(f"{op}: the table cannot read a parameter of type {hint!r}")


def arguments(op: str, params: tuple[Param, ...], args: dict[str, Any], rest: bool = False) -> dict[str, Any]:
    """The method's keyword arguments from the request's, each checked by name; with
    ``rest``, the others too, as they are (the method checks them)."""
    out: dict[str, Any] = {}
    if rest:
        named = {name for name, _, _ in params} | set(GIVEN)
        out.update({k: v for k, v in args.items() if k not in named})
    for name, hint, optional in params:
        if args.get(name) is None:
            if not optional:
                raise Refused(f"{op}: argument {name!r} is missing", "BAD_REQUEST")
            continue
        out[name] = _argument(op, name, hint, args[name])
    return out
