"""A formed world, seen from one rank: who is in it and whether the others are still there; its numbers are its
parts ``turns`` and ``generations`` (:mod:`nbdist.world.counters`), each rank's notes its part ``notes``
(:mod:`nbdist.world.notes`). Its meetings are :mod:`nbdist.world.gather`'s, the heartbeats' judge
:mod:`nbdist.world.liveness`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import HEARTBEAT_INTERVAL
from ..errors import JoinError, PeerLostError, WorldChangedError
from . import keys, records
from .counters import Generations, Turns, current_round
from .liveness import PeerTracker
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
    """One rank's membership of a formed round."""

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
    _next_round_check: float = 0.0
    _next_peer_check: float = 0.0
    _tracker: PeerTracker | None = None
    turns: Turns = field(init=False, repr=False, compare=False)
    generations: Generations = field(init=False, repr=False, compare=False)
    notes: Notes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Each part reads the world's client, round and members as they are at each call, not as they were here.
        self.turns, self.generations = Turns(self), Generations(self)
        self.notes = Notes(self)

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
        self._tracker = None

    # --- health -----------------------------------------------------------
    def check_world(self) -> None:
        """Raise if this round was superseded or failed, or a rank left (for every wait slice)."""
        now = time.monotonic()
        if now < self._next_round_check:
            return
        self._next_round_check = now + 0.5
        latest = current_round(self.client)
        if latest != self.round:
            gone = self._gone()  # a re-run of %%dist_init leaves this round first (Session.init), then opens the next
            who = (f"{', '.join(self.describe(i) for i in gone)} left this world and %%dist_init was re-run" if gone
                   else "another notebook re-ran %%dist_init")
            raise WorldChangedError(
                f"{who} (world round {latest}, this notebook "
                f"is in round {self.round}): re-run %%dist_init here to rejoin"
            )
        error = self.client.get_if(self.key(keys.ERROR))
        if error is not None:
            raise JoinError(records.world_error(error))
        if self.client.add(self.key(keys.LEFT_N), 0) > 0:
            names = ", ".join(self.describe(i) for i in self._gone())
            raise WorldChangedError(
                f"{names} left the world (%dist_destroy or a closed notebook): re-run %%dist_init "
                "in every notebook to form a new world"
            )

    def _gone(self) -> list[int]:
        """The ranks that left this round (:meth:`leave`)."""
        return [i for i in range(self.world_size) if self.client.check([self.key(keys.left(i))])]

    def check_peers(self, client: StoreClient | None = None) -> None:
        """Raise :class:`PeerLostError` if another rank's heartbeat stopped (checked once a second)."""
        now = time.monotonic()
        if now < self._next_peer_check:
            return
        self._next_peer_check = now + HEARTBEAT_INTERVAL
        if self._tracker is None:
            self._tracker = PeerTracker(self.ranks, self.rank)
        dead = self._tracker.dead(client or self.client)
        if dead:
            raise self.lost(dead)

    def lost(self, dead: list[tuple[int, str]]) -> PeerLostError:
        who = "; ".join(f"{self.describe(i)} {why}" for i, why in dead)
        if all(self.ranks[i].process == "nbdist follow" for i, _ in dead):
            again = (f"Once a follower joins again as {'that rank' if len(dead) == 1 else 'those ranks'} (nbdist "
                     f"follow --rank {dead[0][0]} ...), this notebook carries on at its next %%collective; %dist_init "
                     "--spawn again forms a new world")
        else:
            again = ("Once its notebook runs %load_ext nbdist and its %%dist_init again (after a restart, or when "
                     "the network is back), this notebook carries on at its next %%collective")
        return PeerLostError(f"{who}. {again}")

    def leave(self) -> None:
        """Tell the others this rank left (they see it in %dist_status)."""
        self.client.set_json(self.key(keys.left(self.rank)), {"t": time.time()})
        self.client.add(self.key(keys.LEFT_N), 1)
        self.notes.write("left the world")


def step_name(n: int) -> str:
    """The store name of step ``n`` (a cell's keys hang under it): :func:`nbdist.world.keys.step`."""
    return keys.step(n)
