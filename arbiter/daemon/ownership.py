"""Who owns a process that two rules select, and the check that names every such pair.

The order, the same in the daemon and in ``arbiter check``:

1. A process belongs to the first rule, highest ``priority`` first, then by id, whose matcher
   selects it.
2. Except inside a tree: a process in the tree of a rule whose matcher walks the process tree
   (one that selects a program with every process it starts, ``tree: descendants``) goes
   with that rule when its matcher selects it, unless the rule that took it first ranks
   higher (a protected program started from a launcher stays protected).  Where several
   trees hold it, the outermost one (whose claimed process is nearest the root) has it.  A
   proxy that starts servers owns those servers: their VRAM is released through it.

The check builds a small process table from what each matcher says it is written to select
(``Matcher.examples``), each rule's examples alone and started inside every tree rule's
example, runs every matcher over it and claims it as above.  Each pair of rules that select
the same example is named with the rule that owns it and why; a pair that only the ids'
order decides (equal priority, neither inside the other's tree) is a problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from arbiter.plugin import Matcher, ProcessInfo

#: the check's made-up processes take pids no real process has (a matcher may read /proc)
FIRST_PID = 1 << 30
#: (rule id, its matcher, the processes offered) → what it selects (a set of pids)
Select = Callable[[str, Matcher, Sequence[ProcessInfo]], object]


def walks_trees(matcher: Matcher | None) -> bool:
    """Whether the matcher finds processes through other processes (a tree walk)."""
    return matcher is not None and matcher.judges_each_process is not True


def _depth(parent: Mapping[int, int], pid: int) -> int:
    """How many processes of the table are above ``pid``."""
    depth, at, seen = 0, pid, {pid}
    while parent.get(at) in parent and parent[at] not in seen:
        at = parent[at]
        seen.add(at)
        depth += 1
    return depth


@dataclass(frozen=True)
class _Tree:
    """One process table's parent and children links, made once per claim."""

    parent: dict[int, int]
    children: dict[int, list[int]]

    @staticmethod
    def of(table: Sequence[ProcessInfo]) -> _Tree:
        children: dict[int, list[int]] = {}
        for p in table:
            children.setdefault(p.ppid, []).append(p.pid)
        return _Tree({p.pid: p.ppid for p in table}, children)


def _inside(tree: _Tree, roots: Iterable[int]) -> dict[int, int]:
    """Every strict descendant of ``roots`` → the depth of the outermost root above it."""
    parent, children = tree.parent, tree.children
    out: dict[int, int] = {}
    tops = [r for r in roots if children.get(r)]  # most claimed processes start none
    for root in sorted(tops, key=lambda r: _depth(parent, r)):
        depth = _depth(parent, root)
        queue = list(children.get(root, ()))
        while queue:
            pid = queue.pop()
            if pid in out:
                continue
            out[pid] = depth
            queue.extend(children.get(pid, ()))
    return out


def settle_trees(
    order: Sequence[tuple[str, Matcher | None, int]],
    table: Sequence[ProcessInfo],
    pids: Mapping[str, frozenset[int]],
    select: Select,
) -> tuple[dict[str, frozenset[int]], dict[int, tuple[str, str]]]:
    """Give each process inside a tree-walking rule's tree, that its matcher selects, to that
    rule (the outermost tree first), from another rule that does not rank higher or from
    none (below a process another rule took, the first walk could not reach it).  ``order``
    is the rules in claim order, each with its priority; ``pids`` what
    each claimed first come, first served.  Returns the claims and pid → (rule it was taken
    from, rule that owns it now) for each process moved from another rule.  A matcher that fails moves nothing."""
    owner = {pid: rid for rid, mine in pids.items() for pid in mine}
    by_pid = {p.pid: p for p in table}
    tree = _Tree.of(table)
    offers: list[tuple[int, int, str, int]] = []  # (tree depth, rank, rule, pid)
    priority = {rid: p for rid, _, p in order}
    for rank, (rid, matcher, mine_priority) in enumerate(order):
        mine = pids.get(rid, frozenset())
        if not mine or not walks_trees(matcher):
            continue
        # what a rule not above it took, and what no rule could reach (below a process taken)
        inside = {
            pid: d
            for pid, d in _inside(tree, mine).items()
            if (other := owner.get(pid)) != rid and (other is None or priority[other] <= mine_priority)
        }
        if not inside:
            continue
        offered = [by_pid[p] for p in sorted(mine | inside.keys()) if p in by_pid]
        try:
            chosen = select(rid, matcher, offered)  # type: ignore[arg-type]
        except Exception:
            continue
        if not isinstance(chosen, (set, frozenset, list, tuple)):
            continue
        offers.extend((inside[p], rank, rid, p) for p in chosen if p in inside)
    given: dict[int, str] = {}
    for _, _, rid, pid in sorted(offers):
        given.setdefault(pid, rid)  # an outer tree (or an earlier rule at the same depth) first
    if not given:
        return dict(pids), {}
    out = {rid: set(mine) for rid, mine in pids.items()}
    moved: dict[int, tuple[str, str]] = {}
    for pid, now in given.items():
        before = owner.get(pid)
        if before is not None:
            out[before].discard(pid)
            moved[pid] = (before, now)
        out[now].add(pid)
    return {rid: frozenset(mine) for rid, mine in out.items()}, moved


# --- the check ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Overlap:
    """Two rules that select the same process, the rule that owns it and why."""

    first: str
    second: str
    process: str  # the example both select, as a person would name it
    owner: str
    why: str  # "priority", "tree" or "id"
    nested: str = ""  # the rule whose example it was started by, where it was

    @property
    def ambiguous(self) -> bool:
        """Decided only by the ids' order: renaming a rule would change its owner."""
        return self.why == "id"

    def message(self) -> str:
        loser = self.second if self.owner == self.first else self.first
        because = {
            "priority": f"it ranks higher (priority) than {loser!r}",
            "tree": f"it is inside {self.owner!r}'s tree (a process it started)",
            "id": f"only because its id sorts before {loser!r} at equal priority",
        }[self.why]
        return f"{self.first!r} and {self.second!r} both select {self.process}: {self.owner!r} owns it, {because}"


@dataclass(frozen=True)
class CheckedRule:
    rule_id: str
    priority: int
    matcher: Matcher


def _describe(p: ProcessInfo, parent: ProcessInfo | None) -> str:
    text = " ".join(p.cmdline) or p.name or p.exe
    return f"`{text}`" + (f" started by `{' '.join(parent.cmdline) or parent.name}`" if parent else "")


def overlaps(rules: Sequence[CheckedRule]) -> list[Overlap]:
    """Every pair of ``rules`` that select the same example process, with its owner."""
    order = sorted(rules, key=lambda r: (-r.priority, r.rule_id))
    table: list[ProcessInfo] = []
    parent_of: dict[int, ProcessInfo] = {}

    def add(p: ProcessInfo, ppid: int) -> ProcessInfo:
        made = replace(p, pid=FIRST_PID + len(table), ppid=ppid)
        table.append(made)
        return made

    own: dict[str, list[ProcessInfo]] = {}
    for r in order:
        own[r.rule_id] = [add(p, 1) for p in r.matcher.examples()]  # started by init
    started_by: dict[int, str] = {}  # a tree rule's example → that rule
    for r in order:
        if not walks_trees(r.matcher) or not own[r.rule_id]:
            continue
        root = own[r.rule_id][0]
        started_by[root.pid] = r.rule_id
        for other in order:
            if other.rule_id == r.rule_id:
                continue
            for p in other.matcher.examples():
                parent_of[add(p, root.pid).pid] = root
    chosen: dict[str, frozenset[int]] = {}
    for r in order:
        try:
            got = r.matcher.select(table)
        except Exception:
            got = set()
        chosen[r.rule_id] = frozenset(p for p in got if isinstance(p, int))
    first: dict[str, frozenset[int]] = {}
    taken: set[int] = set()
    for r in order:
        first[r.rule_id] = chosen[r.rule_id] - taken
        taken |= first[r.rule_id]
    settled, moved = settle_trees(
        [(r.rule_id, r.matcher, r.priority) for r in order], table, first, lambda rid, m, offer: m.select(offer)
    )
    owner = {pid: rid for rid, mine in settled.items() for pid in mine}
    links = _Tree.of(table)
    rank = {r.rule_id: (-r.priority, r.rule_id) for r in order}
    prio = {r.rule_id: r.priority for r in order}
    matchers = {r.rule_id: r.matcher for r in order}
    found: dict[tuple[str, str], Overlap] = {}
    by_pid = {p.pid: p for p in table}
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            both = sorted(chosen[a.rule_id] & chosen[b.rule_id])
            for pid in both:
                who = owner.get(pid, a.rule_id)
                if who not in (a.rule_id, b.rule_id):
                    continue  # a third rule owns it: its pairs with these two say so
                if pid in moved or (walks_trees(matchers[who]) and pid in _inside(links, settled[who])):
                    why = "tree"
                elif prio[a.rule_id] != prio[b.rule_id]:
                    why = "priority"
                else:
                    why = "id"
                key = (a.rule_id, b.rule_id)
                seen = found.get(key)
                # one line a pair: an ambiguous case is the one to show
                if seen is None or (why == "id" and not seen.ambiguous):
                    parent = parent_of.get(pid)
                    nested = started_by.get(parent.pid, "") if parent else ""
                    found[key] = Overlap(a.rule_id, b.rule_id, _describe(by_pid[pid], parent), who, why, nested)
    return sorted(found.values(), key=lambda o: (rank[o.first], rank[o.second]))


def overlap_lines(found: Sequence[Overlap]) -> list[str]:
    """What ``arbiter check`` prints of them: a line a pair, and for each tree rule one line
    naming the rules whose processes it owns when it starts them (an ambiguous pair is a
    problem, printed with the problems)."""
    lines = [f"overlap: {o.message()}" for o in found if o.why == "priority" and not o.nested]
    trees: dict[str, list[str]] = {}
    kept: dict[str, list[str]] = {}  # a higher rule's process started inside lower rules' trees
    for o in found:
        other = o.second if o.owner == o.first else o.first
        if o.why == "tree":
            trees.setdefault(o.owner, []).append(other)
        elif o.why == "priority" and o.nested:
            kept.setdefault(o.owner, []).append(other)
    lines.extend(
        f"overlap: a process of {', '.join(map(repr, others))} started inside {owner!r}'s tree goes with {owner!r}"
        for owner, others in trees.items()
    )
    lines.extend(
        f"overlap: a process of {owner!r} started inside the tree of {', '.join(map(repr, others))} stays "
        f"{owner!r}'s: it ranks higher"
        for owner, others in kept.items()
    )
    return lines
