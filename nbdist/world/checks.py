"""What every wait of a rank checks in each slice: that its world still stands (its round is the current one, did
not fail, and no rank left it) and that the other ranks still live (their heartbeats, judged by
:class:`nbdist.world.liveness.PeerTracker`). Each check reads the store at most every so often, however often a
wait asks.
"""

from __future__ import annotations

import time
from typing import Protocol

from ..config import HEARTBEAT_INTERVAL
from ..errors import JoinError, PeerLostError, WorldChangedError
from . import keys, records
from .counters import current_round
from .liveness import PeerTracker
from .records import Registration
from .store import StoreClient


class Member(Protocol):
    """What the checks read of their world (:class:`nbdist.world.world.World`): its connection, round and members.
    Read at each call: a test may wrap the connection after the world was made."""

    client: StoreClient
    round: int
    rank: int
    world_size: int
    ranks: list[Registration]

    def key(self, name: str) -> str: ...

    def describe(self, i: int) -> str: ...


class Checks:
    """One rank's checks of its world, each at most every so often (see the module docstring)."""

    def __init__(self, world: Member) -> None:
        self._world = world
        self._next_round_check = 0.0
        self._next_peer_check = 0.0
        self._tracker: PeerTracker | None = None

    def world(self) -> None:
        """Raise if this round was superseded or failed, or a rank left (for every wait slice)."""
        now = time.monotonic()
        if now < self._next_round_check:
            return
        self._next_round_check = now + 0.5
        w = self._world
        latest = current_round(w.client)
        if latest != w.round:
            gone = self._gone()  # a re-run of %%dist_init leaves this round first (Session.init), then opens the next
            who = (f"{', '.join(w.describe(i) for i in gone)} left this world and %%dist_init was re-run" if gone
                   else "another notebook re-ran %%dist_init")
            raise WorldChangedError(
                f"{who} (world round {latest}, this notebook "
                f"is in round {w.round}): re-run %%dist_init here to rejoin"
            )
        error = w.client.get_if(w.key(keys.ERROR))
        if error is not None:
            raise JoinError(records.world_error(error))
        if w.client.add(w.key(keys.LEFT_N), 0) > 0:
            names = ", ".join(w.describe(i) for i in self._gone())
            raise WorldChangedError(
                f"{names} left the world (%dist_destroy or a closed notebook): re-run %%dist_init "
                "in every notebook to form a new world"
            )

    def _gone(self) -> list[int]:
        """The ranks that left this round (:meth:`nbdist.world.world.World.leave`)."""
        w = self._world
        return [i for i in range(w.world_size) if w.client.check([w.key(keys.left(i))])]

    def peers(self, client: StoreClient | None = None) -> None:
        """Raise :class:`PeerLostError` if another rank's heartbeat stopped (checked once a second)."""
        now = time.monotonic()
        if now < self._next_peer_check:
            return
        self._next_peer_check = now + HEARTBEAT_INTERVAL
        w = self._world
        if self._tracker is None:
            self._tracker = PeerTracker(w.ranks, w.rank)
        dead = self._tracker.dead(client or w.client)
        if dead:
            raise self.lost(dead)

    def members_changed(self) -> None:
        """The world's registrations were read again (a rank may have been replaced): judge its peers afresh."""
        self._tracker = None

    def lost(self, dead: list[tuple[int, str]]) -> PeerLostError:
        """The error that says ``dead`` (rank, why) are gone, and what carries this notebook on."""
        w = self._world
        who = "; ".join(f"{w.describe(i)} {why}" for i, why in dead)
        if all(w.ranks[i].process == "nbdist follow" for i, _ in dead):
            again = (f"Once a follower joins again as {'that rank' if len(dead) == 1 else 'those ranks'} (nbdist "
                     f"follow --rank {dead[0][0]} ...), this notebook carries on at its next %%collective; %dist_init "
                     "--spawn again forms a new world")
        else:
            again = ("Once its notebook runs %load_ext nbdist and its %%dist_init again (after a restart, or when "
                     "the network is back), this notebook carries on at its next %%collective")
        return PeerLostError(f"{who}. {again}")
