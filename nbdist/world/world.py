"""A formed world, seen from one rank: who is in it, its connection and its round's keys, and its parts, each with
one job: its numbers (``turns``, ``generations``: :mod:`nbdist.world.counters`), each rank's notes (``notes``:
:mod:`nbdist.world.notes`) and the checks of every wait (``checks``: :mod:`nbdist.world.checks`). Its meetings
are :mod:`nbdist.world.gather`'s, the heartbeats' judge :mod:`nbdist.world.liveness`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import JoinError
from . import keys, records
from .checks import Checks
from .counters import Generations, Turns
from .notes import Notes
from .records import MalformedRecord, Registration
from .store import StoreClient


def read_ranks(texts: list[str], before: list[Registration] | None = None) -> list[Registration]:
    """Each rank's registration, from its slot's text in a formed round. A slot that holds something else (anyone
    can write into the store) keeps the registration read ``before``; with none, the join fails naming it."""
    ranks = []
    for i, text in enumerate(texts):
        try:
            ranks.append(Registration.from_json(text))
        except MalformedRecord as exc:
            if before is None or i >= len(before):
                raise JoinError(f"rank {i}'s slot in the store holds no registration ({exc}): "
                                f"{records.shown(text)}; run %%dist_init again in every notebook") from None
            ranks.append(before[i])
    return ranks


@dataclass
class World:
    """One rank's membership of a formed round, and its parts (see the module docstring)."""

    client: StoreClient
    round: int
    rank: int
    world_size: int
    me: Registration
    ranks: list[Registration] = field(default_factory=list)
    gen: int = 0
    replaced: Registration | None = None  # the registration this rank took over, if any
    pg: Any = None  # the ProcessGroup of the current generation, once built
    last_turn: int | None = None  # the last step this rank met the others at
    attend: Callable[[], None] | None = None  # called as this rank waits in the main thread (a driven rank's debugger)
    turns: Turns = field(init=False, repr=False, compare=False)
    generations: Generations = field(init=False, repr=False, compare=False)
    notes: Notes = field(init=False, repr=False, compare=False)
    checks: Checks = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Each part reads the world's client, round and members as they are at each call, not as they were here.
        self.turns, self.generations = Turns(self), Generations(self)
        self.notes, self.checks = Notes(self), Checks(self)

    def registrations(self) -> list[dict[str, Any]]:
        """Each rank's registration as its JSON object (for the pure parts that take one: views, plans, checks)."""
        return [info.as_dict() for info in self.ranks]

    def key(self, name: str) -> str:
        """``name`` (built by :mod:`nbdist.world.keys`) in this world's round."""
        return keys.in_round(self.round, name)

    def describe(self, i: int) -> str:
        info = self.ranks[i] if i < len(self.ranks) else None
        return f"rank {i} ({info.host}, pid {info.pid})" if info is not None else f"rank {i} (?, pid ?)"

    def enter_generation(self, gen: int) -> None:
        """Take ``gen`` as this world's generation and re-read the registrations (a rank may have been replaced)."""
        self.gen = gen
        names = [self.key(keys.rank(i)) for i in range(self.world_size)]
        self.ranks = read_ranks(self.client.multi_get(names), self.ranks)
        self.checks.members_changed()

    def leave(self) -> None:
        """Tell the others this rank left (they see it in %dist_status)."""
        self.client.set_json(self.key(keys.left(self.rank)), {"t": time.time()})
        self.client.add(self.key(keys.LEFT_N), 1)
        self.notes.write("left the world")


def step_name(n: int) -> str:
    """The store name of step ``n`` (a cell's keys hang under it): :func:`nbdist.world.keys.step`."""
    return keys.step(n)
