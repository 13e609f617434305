"""``%%collective --trace``: when each collective entered and left, on every rank, and who was late.

While a traced body runs, the cell's :class:`~nbdist.cell.fingerprint.Checker`
appends one tuple per call (two clock reads and an append). Times count from
the moment this rank left the cell's start barrier, which every rank leaves at
about the same instant (within a store round trip), so ranks on different
hosts need no common clock. At the end each rank publishes its calls
(:func:`events`) in its record; every notebook merges them (:func:`merge`) and
reads, per collective, who arrived last and how long the others waited
(:func:`lateness`). :mod:`nbdist.view.timeline` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

LATE = 0.01  # seconds: an arrival later than this after the first is called late


def _nbytes(desc: Any) -> int:
    import torch

    if isinstance(desc, list):
        return sum(_nbytes(d) for d in desc)
    if isinstance(desc, dict) and "shape" in desc:
        dtype = getattr(torch, str(desc.get("dtype")), None)
        size = dtype.itemsize if isinstance(dtype, torch.dtype) else 0
        return math.prod(desc["shape"]) * size
    return 0


def size_of(fp: dict[str, Any] | None) -> int:
    """Bytes a collective moves per rank, from its fingerprint: its largest tensor argument (or list of them)."""
    if not fp:
        return 0
    return max((_nbytes(v) for k, v in fp.items() if isinstance(v, dict | list)), default=0)


def events(raw: list[tuple[Any, ...]], sigs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One rank's recorded calls, JSON-ready: group, number in that group, op, bytes, entered and left (s)."""
    sizes: dict[int, int] = {}
    out = []
    for group, seq, op, crc, entered, left in raw:
        if crc is not None and crc not in sizes:
            sizes[crc] = size_of(sigs.get(crc))
        out.append({"group": group, "seq": seq, "op": op, "bytes": sizes.get(crc, 0),
                    "enter": round(entered, 6), "leave": round(left, 6)})
    return out


def merge(traced: Sequence[Sequence[Mapping[str, Any]] | None]) -> list[dict[str, Any]]:
    """Every rank's traced calls (by rank, as its record holds them: :func:`events`; None: none), each with its
    ``rank``, in order of entry."""
    merged = [{**e, "rank": rank} for rank, calls in enumerate(traced) for e in calls or ()]
    return sorted(merged, key=lambda e: (e["enter"], e["rank"]))


def lateness(merged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per collective (group, number), in order: who arrived last, how late, and each rank's wait in it."""
    by_call: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in merged:
        if e["seq"] is not None:
            by_call.setdefault((e["group"], e["seq"]), []).append(e)
    rows = []
    for (group, seq), calls in by_call.items():
        first = min(c["enter"] for c in calls)
        last = max(calls, key=lambda c: c["enter"])
        rows.append({
            "group": group, "seq": seq, "op": last["op"], "bytes": last["bytes"], "first": first,
            "ranks": sorted(c["rank"] for c in calls), "last": last["rank"], "late": last["enter"] - first,
            "waits": {c["rank"]: round(last["enter"] - c["enter"], 6) for c in calls},
        })
    return sorted(rows, key=lambda r: (r["first"], r["group"], r["seq"]))


def seconds_text(s: float) -> str:
    """Seconds in the unit that reads best, rounded before the unit is chosen (0.99996 s is "1.0 s")."""
    if round(s, 1) >= 1:
        return f"{s:.1f} s"
    return f"{s * 1000:.1f} ms" if round(s * 1000, 1) >= 1 else f"{s * 1e6:.0f} µs"


def notable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The collectives whose last rank was notably late: over LATE, and over a quarter of the worst lateness."""
    worst = max((r["late"] for r in rows), default=0.0)
    return [r for r in rows if r["late"] > max(LATE, worst / 4) and len(r["ranks"]) > 1]


def headline(rows: list[dict[str, Any]], world_size: int) -> list[str]:
    """The lateness worth reading, in words: 'rank 1 is 2.1 s late at all_reduce #3' (the worst few)."""
    late = sorted(notable(rows), key=lambda r: -r["late"])
    lines = []
    for r in late[:5]:
        where = "" if r["group"] == "0" else f" of group {r['group']}"
        lines.append(f"rank {r['last']} is {seconds_text(r['late'])} late at {r['op']} #{r['seq']}{where}")
    if len(late) > 5:
        lines.append(f"… and {len(late) - 5} more collective(s) with a rank notably late")
    return lines
