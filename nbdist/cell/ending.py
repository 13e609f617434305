"""A ``%%collective``'s end: what the last rank to arrive finds for every rank, and whose records each rank reads.

Each rank publishes its record at the cell's end (``t/<n>/out/<i>``: its capture, its collectives' checks,
its process group's state) and meets the others (``t/<n>/out``). What every rank must know from all the
records is found once, by the last rank to arrive, which reads them all (one ``multi_get``) and opens the
meeting with it (:func:`nbdist.world.verdict.go`): why the process group can no longer be trusted, if it
cannot (:func:`nbdist.backend.procgroup.verdict`); which collectives that ran unchecked did not match
(:func:`nbdist.cell.history.end_mismatch`); which ranks failed. The others read it with the meeting's
verdict, which they read anyway. Then:

- a rank that shows the cell's table (a notebook running its own cells, a driving notebook, a following
  one that shows them) reads every record, once;
- a rank that shows none (a spawned worker, ``nbdist follow``, ``%dist_follow --quiet``) reads only the
  records of the ranks that failed, whose errors its own cell ends with: none when no rank failed.

So what a rank that shows nothing reads at a cell's end does not grow with the world's size. The verdict is
anyone's text (anyone who reaches the store can write it): what does not read as nbdist's findings makes
the rank read every record and find for itself, as every rank once did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..backend import procgroup
from ..world import keys
from ..world.capture_record import Capture
from ..world.verdict import Kind, Verdict
from ..world.world import World
from . import history
from .fingerprint import differences


@dataclass(frozen=True)
class Found:
    """What the last rank to arrive at a cell's end found in every rank's record."""

    distrusted: str | None = None  # why the process group cannot be trusted after the cell (None: it can)
    mismatch: str | None = None  # collectives that ran unchecked and did not match across ranks
    failed: tuple[int, ...] = ()  # the ranks whose record holds an error

    def encode(self) -> str:
        found: dict[str, Any] = {"distrusted": self.distrusted, "mismatch": self.mismatch,
                                 "failed": list(self.failed)}
        return json.dumps({k: v for k, v in found.items() if v}, separators=(",", ":"))


def find(records: list[Capture | None]) -> Found:
    """What every rank needs to know from every rank's record (None: a rank's record that is not one)."""
    distrusted = procgroup.verdict({i: None if r is None else r.pg for i, r in enumerate(records)})
    failed = tuple(i for i, r in enumerate(records) if r is not None and r.error is not None)
    return Found(distrusted, mismatch(records), failed)


def mismatch(records: list[Capture | None]) -> str | None:
    """Collectives that ran without a comparison first and did not match (only when no rank failed)."""
    checks = {i: r.checks for i, r in enumerate(records) if r is not None and r.error is None and r.checks is not None}
    if len(checks) < len(records):
        return None
    return history.end_mismatch(checks, differences)


def decode(opened: Verdict, world_size: int) -> Found | None:
    """What the verdict that opened a cell's end says was found; None when it says nothing nbdist wrote."""
    if opened.kind is not Kind.GO:
        return None
    try:
        found = json.loads(opened.why)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    distrusted, mismatch_, failed = found.get("distrusted"), found.get("mismatch"), found.get("failed", [])
    if not all(v is None or isinstance(v, str) for v in (distrusted, mismatch_)) or not isinstance(failed, list):
        return None
    if not all(type(i) is int and 0 <= i < world_size for i in failed):
        return None
    return Found(distrusted or None, mismatch_ or None, tuple(sorted(set(failed))))


def read(world: World, cell: str, ranks: list[int]) -> list[Capture | None]:
    """The records of ``ranks`` at ``cell``'s end, in one read (every rank published its record before it arrived)."""
    texts = world.client.multi_get([world.key(keys.out(cell, i)) for i in ranks]) if ranks else []
    return [Capture.read(t) for t in texts]


def records(world: World, cell: str, opened: Verdict, own: Capture | None, everyone: bool,
            read_all: list[Capture | None] | None = None) -> tuple[list[Capture | None], Found]:
    """Every rank's record as this rank needs it (None where it read none), and what was found in them.

    ``opened``: the verdict the end's meeting opened with; ``own``: this rank's record as it published it;
    ``everyone``: this rank shows the table, so it reads every record; ``read_all``: every record, when
    this rank read them already (it arrived last and found what ``opened`` says).
    """
    found = decode(opened, world.world_size)
    if read_all is None and (everyone or found is None):
        read_all = read(world, cell, list(range(world.world_size)))
    if found is None:  # nothing nbdist's last rank found: find it here
        assert read_all is not None
        found = find(read_all)
    if read_all is not None:
        return read_all, found
    captures: list[Capture | None] = [None] * world.world_size
    captures[world.rank] = own
    others = [i for i in found.failed if i != world.rank]
    for i, record in zip(others, read(world, cell, others), strict=True):
        captures[i] = record
    return captures, found
