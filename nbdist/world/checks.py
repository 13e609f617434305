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
from .exited_record import Exited
from .liveness import PeerTracker
from .records import Registration
from .store import StoreClient

EXIT_WAIT = 3.0  # seconds a rank waits for the notebook that spawned a worker whose kernel died to say how it ended


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
            raise self.lost(dead, client)

    def members_changed(self) -> None:
        """The world's registrations were read again (a rank may have been replaced): judge its peers afresh."""
        self._tracker = None

    def lost(self, dead: list[tuple[int, str]], client: StoreClient | None = None) -> PeerLostError:
        """The error that says ``dead`` (rank, why) are gone, and what carries this notebook on. A spawned worker
        whose kernel died is said as the notebook that started it saw it end (:class:`.exited_record.Exited`, read on
        ``client``, else the world's): how, its last lines, and what became of its slot, the message's last words."""
        w = self._world
        exits = {i: self._exit_of(i, client or w.client) for i, why in dead
                 if w.ranks[i].spawned and why.startswith("is gone")}
        who = "; ".join(_gone(w.describe(i), why, exits.get(i)) for i, why in dead)
        told = [e for e in exits.values() if e is not None]
        if told and len(told) == len(dead):
            carry = (" This notebook carries on at its next %%collective once the new kernel has joined (%dist_workers "
                     "shows it in the notebook that started it);" if any(e.restarted for e in told) else "")
            return PeerLostError(f"{who}.{carry} {'; '.join(e.then for e in told)}")
        if all(w.ranks[i].process == "nbdist follow" for i, _ in dead):
            again = (f"Once a follower joins again as {'that rank' if len(dead) == 1 else 'those ranks'} (nbdist "
                     f"follow --rank {dead[0][0]} ...), this notebook carries on at its next %%collective; %dist_init "
                     "--spawn again forms a new world")
        elif all(w.ranks[i].spawned for i, _ in dead):
            again = ("The notebook that started it (%dist_init --spawn) starts it again in its slot if it can "
                     "(%dist_workers there); this notebook carries on at its next %%collective once it has joined")
        else:
            again = ("Once its notebook runs %load_ext nbdist and its %%dist_init again (after a restart, or when "
                     "the network is back), this notebook carries on at its next %%collective")
        return PeerLostError(f"{who}. {again}")

    def _exit_of(self, i: int, client: StoreClient) -> Exited | None:
        """How spawned worker ``i``'s kernel (the one registered) ended, once the notebook that started it says so,
        within :data:`EXIT_WAIT` s; None if it does not (it may be gone too)."""
        w = self._world
        deadline = time.monotonic() + EXIT_WAIT
        while True:
            told = Exited.read(client.get_if(w.key(keys.exited(i))))
            if told is not None and told.pid == w.ranks[i].pid:
                return told
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)


def _gone(who: str, why: str, told: Exited | None) -> str:
    """One dead rank, in words: how its kernel ended and its last lines, where the notebook that started it said."""
    if told is None:
        return f"{who} {why}"
    lines = " / ".join(line.strip() for line in told.lines[-3:] if line.strip())
    return f"{who} is gone: its kernel {told.how}" + (f" (its last lines: {lines})" if lines else "")
