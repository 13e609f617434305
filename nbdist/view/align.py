"""Aligning the ranks' output sequences, so that equal outputs are shown once and none is reordered.

Pure: each rank's outputs are a list of keys (equal keys mean equal content).
:func:`align` splits them into segments, in order: a *same* segment is one
output that every rank produced at that point; a *differ* segment holds, per
rank, the outputs between two same segments. Each rank's own order is kept.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

# Past this many key comparisons, the middle between the common head and tail is one differing segment
# (a live table aligns twice a second; a full alignment of thousands of outputs would stall it).
MAX_WORK = 40_000


@dataclass(frozen=True)
class Segment:
    """``same``: every rank's output at ``spans[r]`` (one each) is equal; else each rank's slice differs."""

    same: bool
    spans: tuple[tuple[int, int], ...]  # per rank: [start, stop) into its outputs


def _lcs(a: Sequence[Hashable], b: Sequence[Hashable]) -> list[Hashable]:
    """A longest common subsequence of two key lists (dynamic programming, O(len(a)·len(b)))."""
    rows = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        row, below = rows[i], rows[i + 1]
        for j in range(len(b) - 1, -1, -1):
            row[j] = below[j + 1] + 1 if a[i] == b[j] else max(below[j], row[j + 1])
    common, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            common.append(a[i])
            i, j = i + 1, j + 1
        elif rows[i + 1][j] >= rows[i][j + 1]:
            i += 1
        else:
            j += 1
    return common


def _common(seqs: list[Sequence[Hashable]]) -> list[Hashable]:
    """Keys every rank produced, in an order every rank produced them."""
    common: list[Hashable] = list(seqs[0])
    for seq in seqs[1:]:
        if len(common) * len(seq) > MAX_WORK:
            return []
        common = _lcs(common, seq)
    return common


def align(seqs: list[Sequence[Hashable]]) -> list[Segment]:
    """Segments covering every rank's outputs, in order (see the module docstring)."""
    n = len(seqs)
    if n == 0:
        return []
    head = 0
    while all(head < len(s) for s in seqs) and all(s[head] == seqs[0][head] for s in seqs):
        head += 1
    tail = 0
    while (all(tail < len(s) - head for s in seqs)
           and all(s[len(s) - 1 - tail] == seqs[0][len(seqs[0]) - 1 - tail] for s in seqs)):
        tail += 1
    middles = [s[head:len(s) - tail] for s in seqs]
    segments = [Segment(True, tuple((k, k + 1) for _ in seqs)) for k in range(head)]
    starts = [head] * n
    positions = [0] * n  # into each middle
    for key in (_common(middles) if n > 1 else []):
        found = []
        for r, middle in enumerate(middles):
            p = positions[r]
            while middle[p] != key:  # present: the common keys are a subsequence of every middle
                p += 1
            found.append(p)
        _differ(segments, [(head + positions[r], head + found[r]) for r in range(n)])
        segments.append(Segment(True, tuple((head + p, head + p + 1) for p in found)))
        positions = [p + 1 for p in found]
    _differ(segments, [(head + positions[r], head + len(middles[r])) for r in range(n)])
    ends = [len(s) - tail for s in seqs]
    segments += [Segment(True, tuple((e + k, e + k + 1) for e in ends)) for k in range(tail)]
    del starts
    return segments


def _differ(segments: list[Segment], spans: list[tuple[int, int]]) -> None:
    if any(stop > start for start, stop in spans):
        segments.append(Segment(False, tuple(spans)))
