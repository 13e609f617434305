"""Where the ranks' operation logs part ways: the first operation whose output differs, found by a collective of hashes.

Every rank holds its own log (:class:`nbdist.diverge.oplog.OpLog`); what crosses between ranks is 8-byte
digests and, at the end, one small record. A first round gathers each rank's length and the digest of its whole
log (of names and output hashes, and of names alone): equal on every rank that should agree, and the answer
is one line. Otherwise a binary search over prefixes finds the first operation where they differ: each round
gathers one 8-byte prefix digest from every rank, so a log of 100,000 operations takes 17 rounds of 8 bytes
a rank, not 800 KB a rank gathered everywhere (a rank's log never leaves it). A second search finds the first
operation whose *name* differs (a skipped ``all_reduce``, a branch taken on one rank), when the names differ
at all. A last round gathers each rank's record of those operations and the few before them, as JSON.

Pure: the rounds go through ``ask`` (each rank's answer to a question put to its own log, gathered), so the
search and the text are tested as tables (``tests/diverge/test_oplog.py``). Every rank decides alike from the
same gathered answers, so every rank prints the same text and the cell's table shows it once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import ranksets


class OpLog(Protocol):
    """A rank's log as the comparison reads it (:class:`nbdist.diverge.oplog.OpLog`)."""

    ops: list[Any]  # nbdist.diverge.oplog.Op
    unrecorded: int

    def __len__(self) -> int: ...
    def prefix(self, n: int, names_only: bool = False) -> int: ...


Ask = Callable[[Callable[[OpLog], list[int]]], list[list[int]]]  # each rank's answer, by rank
AskText = Callable[[Callable[[OpLog], str]], list[str]]
BEFORE = 3  # operations shown before the first that differs
_CUT = 120  # characters of a name or shapes kept in the last round's record


@dataclass(frozen=True)
class Finding:
    """What the comparison found, the same on every rank: ``members`` should agree; ``lengths`` and ``unrecorded``
    by rank; ``first`` the index of the first operation that differs (None: all agreed), ``first_name`` that of the
    first whose name differs (None: the names agree); ``at`` and ``at_name`` each rank's record of those (None
    past its log's end); ``before`` the lowest member's records of the operations before ``first``."""

    members: tuple[int, ...]
    replicas: bool
    lengths: list[int]
    unrecorded: list[int]
    first: int | None = None
    first_name: int | None = None
    at: list[dict[str, Any] | None] | None = None
    at_name: list[dict[str, Any] | None] | None = None
    before: list[dict[str, Any]] | None = None


def _alike(values: Sequence[Any], members: Sequence[int]) -> bool:
    return len({values[r] for r in members}) == 1


def _prefix(n: int, names_only: bool) -> Callable[[OpLog], list[int]]:
    return lambda log: [log.prefix(n, names_only)]


def _search(ask: Ask, members: Sequence[int], hi: int, names_only: bool) -> int:
    """The index of the first operation where the members' logs differ, given that their prefixes of ``hi``
    operations differ (and their empty prefixes agree)."""
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        said = ask(_prefix(mid, names_only))
        if _alike([s[0] for s in said], members):
            lo = mid
        else:
            hi = mid
    return hi - 1


def record(op: Any, index: int) -> dict[str, Any] | None:
    """An operation as the last round carries it (None: past the log's end)."""
    if op is None:
        return None
    return {"i": index, "name": op.name[:_CUT], "shapes": op.shapes[:_CUT], "digest": op.digest, "line": op.line,
            "node": None if op.node is None else op.node[:_CUT], "origin": op.origin}


def _records(log: OpLog, first: int | None, first_name: int | None) -> str:
    def at(i: int | None) -> dict[str, Any] | None:
        return None if i is None or i >= len(log.ops) else record(log.ops[i], i)

    before = [] if first is None else [record(log.ops[i], i) for i in range(max(0, first - BEFORE), first)]
    return json.dumps({"at": at(first), "at_name": at(first_name), "before": before})


def compare(ask: Ask, ask_text: AskText, world_size: int, replicas: Sequence[int] | None = None) -> Finding:
    """Compare every rank's log (``replicas``: only these ranks must agree); see the module docstring."""
    members = tuple(sorted(set(replicas))) if replicas is not None else tuple(range(world_size))
    heads = ask(lambda log: [len(log), log.unrecorded, log.prefix(len(log)), log.prefix(len(log), names_only=True)])
    lengths, unrecorded = [h[0] for h in heads], [h[1] for h in heads]
    found = Finding(members, replicas is not None, lengths, unrecorded)
    if _alike([(h[0], h[2]) for h in heads], members):
        return found
    longest = max(lengths[r] for r in members)
    first = _search(ask, members, longest, names_only=False)
    first_name = (None if _alike([(h[0], h[3]) for h in heads], members)
                  else _search(ask, members, longest, names_only=True))
    said = [json.loads(text) for text in ask_text(lambda log: _records(log, first, first_name))]
    return Finding(members, replicas is not None, lengths, unrecorded, first, first_name,
                   at=[s["at"] for s in said], at_name=[s["at_name"] for s in said], before=said[members[0]]["before"])


def _hex(digest: int | None) -> str:
    return "not compared" if digest is None else f"hash {digest & 0xFFFFFFFFFFFFFFFF:016x}"


def where(rec: dict[str, Any]) -> str:
    """``line 3``, ``line 7 (backward of line 3, ReluBackward0)``: where an operation ran, in the cell."""
    at = "line ?" if rec["line"] is None else f"line {rec['line']}"
    if rec["node"] is None:
        return at
    of = "" if rec["origin"] is None else f"of line {rec['origin']}, "
    return f"{at} (backward {of}{rec['node']})"


def _op(rec: dict[str, Any], digest: bool = False, number: bool = True) -> str:
    shapes = f" → {rec['shapes']}" if rec["shapes"] else ""
    tail = f" ({_hex(rec['digest'])})" if digest or rec["digest"] is None else ""
    return f"{'#' + str(rec['i'] + 1) + ' ' if number else ''}{where(rec)}: {rec['name']}{shapes}{tail}"


def _by_rank(recs: list[dict[str, Any] | None], members: Sequence[int], lengths: list[int],
             say: Callable[[dict[str, Any]], str]) -> list[str]:
    """One line per group of members whose record says the same, in rank order."""
    groups: dict[str, list[int]] = {}
    for r in members:
        rec = recs[r]
        text = f"its log ended after {lengths[r]:,} operation(s)" if rec is None else say(rec)
        groups.setdefault(text, []).append(r)
    return [f"  {ranksets.ranks_text(ranks)}: {text}" for text, ranks in groups.items()]


def describe(found: Finding) -> str:
    """The answer, as every rank prints it."""
    members, lengths = found.members, found.lengths
    who = ranksets.ranks_text(members) + (" (--replicas)" if found.replicas else "")
    cut = max(found.unrecorded[r] for r in members)
    limit = (f" Recording stopped at the first {min(lengths[r] for r in members):,} operations "
             f"({cut:,} more ran unrecorded)." if cut else "")
    if found.first is None:
        return f"find-divergence: all {lengths[members[0]]:,} operations agreed on {who}.{limit}"
    assert found.at is not None and found.before is not None
    first, at = found.first, found.at
    named = [rec for rec in (at[r] for r in members) if rec is not None]
    same_op = len({(rec["name"], rec["line"]) for rec in named}) == 1 and len(named) == len(members)
    if same_op:
        head = f"find-divergence: {who} part ways at operation #{first + 1}, {_op(named[0], number=False)}"
        lines = [f"{head}; its output by rank:", *_by_rank(at, members, lengths, lambda rec: _hex(rec["digest"]))]
    else:
        lines = [f"find-divergence: {who} part ways at operation #{first + 1}: they ran different operations, "
                 "or at different lines:",
                 *_by_rank(at, members, lengths, lambda rec: _op(rec, digest=True))]
    if found.first_name is not None and found.first_name != first and found.at_name is not None:
        lines += [f"the operations themselves first differ at #{found.first_name + 1}:",
                  *_by_rank(found.at_name, members, lengths, lambda rec: _op(rec))]
    if found.before:
        lines += [f"before it, {who} agreed on {first:,} operation(s); the last {len(found.before)}:",
                  *(f"  {_op(rec)}" for rec in found.before)]
    else:
        lines.append("it is the body's first operation.")
    return "\n".join(lines) + (f"\n{limit.strip()}" if limit else "")
