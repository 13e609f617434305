"""The ``%%collective`` cells a notebook ran in its world, as they ended, and which of them ``%dist_replay`` may run
again on a restarted rank: pure.

The magics record each cell as it ended (:meth:`History.ended`): its body's source, how many collectives its
ranks issued together (from their captures), the ranks it ran on (``--ranks``), whether it failed, and when it
ended. The session holds one :class:`History` for the world it is in, cleared when it leaves that world. A rank
whose kernel was restarted at time T lost what the cells that ended before T defined; of those, :func:`choose`
picks the ones it can run again there alone: the cells that called no collective on any rank, ran on that rank,
and did not fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..world.capture_record import Capture

FIRST_LINE_CHARS = 60  # of a cell's first line, in the messages that name it


@dataclass(frozen=True)
class Entry:
    """One ``%%collective`` as it ended: ``number`` (its step, ``%%collective #n``), the body's ``source``,
    ``collectives`` (issued by its ranks together; None: some rank's count is not known), ``ranks`` (its
    ``--ranks``; None: every rank), ``failed`` (it raised somewhere, or was cut short) and ``at`` (when it ended,
    ``time.monotonic()``)."""

    number: int
    source: str
    collectives: int | None
    ranks: tuple[int, ...] | None
    failed: bool
    at: float

    def runs_on(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def label(self) -> str:
        """``#3 (import math)``: its number and the first line of its body that says something."""
        lines = [s.strip() for s in self.source.splitlines() if s.strip() and not s.strip().startswith("#")]
        first = lines[0] if lines else "(empty)"
        if len(first) > FIRST_LINE_CHARS or len(lines) > 1:
            first = first[:FIRST_LINE_CHARS].rstrip() + " …"
        return f"#{self.number} ({first})"


def entry(number: int, source: str, ranks: tuple[int, ...] | None, captures: Sequence[Capture | None], cut: bool,
          at: float) -> Entry:
    """The entry of a cell that ended with ``captures`` (by rank: a rank that sent none leaves its count unknown);
    ``cut``: the cell was cut short on every rank (a failure, the stop button, a rank gone)."""
    counts = [None if c is None or c.collectives is None else sum(c.collectives.values()) for c in captures]
    total = None if not counts or None in counts else sum(n for n in counts if n is not None)
    failed = cut or any(c is not None and c.error is not None for c in captures)
    return Entry(number, source, total, ranks, failed, at)


@dataclass(frozen=True)
class Choice:
    """What ``%dist_replay`` does on one ``rank``: the cells it runs again, in order (``replay``), and those it
    leaves: with collectives (or whose count is not known), run on other ranks only, or failed."""

    rank: int
    replay: list[Entry] = field(default_factory=list)
    collectives: list[Entry] = field(default_factory=list)
    elsewhere: list[Entry] = field(default_factory=list)
    failed: list[Entry] = field(default_factory=list)


def choose(entries: Iterable[Entry], rank: int, before: float | None) -> Choice:
    """Which of ``entries`` (in the order they ran) ``rank`` runs again: of those that ended before ``before`` (its
    kernel's restart; None: all of them), each that ran there, called no collective and did not fail. A cell that
    failed is left, whatever else it did: it may have failed halfway, and the notebook's person ran it again."""
    choice = Choice(rank)
    for e in entries:
        if before is not None and e.at >= before:
            continue  # it ran on the new kernel already
        if e.failed:
            choice.failed.append(e)
        elif not e.runs_on(rank):
            choice.elsewhere.append(e)
        elif e.collectives != 0:
            choice.collectives.append(e)
        else:
            choice.replay.append(e)
    return choice


class Ended(Protocol):
    """A cell's outcome as the history reads it (:class:`nbdist.cell.cells.Outcome`)."""

    @property
    def number(self) -> int: ...
    @property
    def captures(self) -> list[Capture | None]: ...
    @property
    def reason(self) -> object: ...


class History:
    """This notebook's ``%%collective`` cells in its world, and each rank's restarts that a replay answered;
    ``clock``: when a cell ends."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.entries: list[Entry] = []
        self.replayed: dict[int, int] = {}  # rank -> its kernel's restarts when it was last replayed
        # In a kernel that took over a rank's slot, the last step before it joined, until a replay answered it
        # (a peer notebook's replay: replay.shared).
        self.joined_after: int | None = None

    def ended(self, source: str, ranks: tuple[int, ...] | None, outcome: Ended, cut: bool = False) -> None:
        """The cell ``source`` (run on ``ranks``) ended as ``outcome`` says; ``cut``: an error ended it early."""
        self.entries.append(entry(outcome.number, source, ranks, outcome.captures,
                                  cut or outcome.reason is not None, self.clock()))

    def clear(self) -> None:
        """A new world (``%dist_init``) or none (``%dist_destroy``): nothing of the old one is replayed."""
        self.entries.clear()
        self.replayed.clear()
        self.joined_after = None

    def restarted(self, restarts: Mapping[int, Sequence[float]]) -> list[int]:
        """The ranks restarted since their last replay (``restarts``: each rank's restart times)."""
        return sorted(r for r, times in restarts.items() if len(times) > self.replayed.get(r, 0))

    def answered(self, restarts: Mapping[int, int]) -> None:
        """A replay ran on these ranks, each restarted that many times then."""
        self.replayed.update(restarts)
