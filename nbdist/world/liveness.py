"""Which other ranks are alive, by their heartbeats (:mod:`nbdist.world.pulse`) as this rank's own clock sees
them move: every wait's peer check (:meth:`nbdist.world.checks.Checks.peers`), and the debuggers' watch of the
rank they stop."""

from __future__ import annotations

import time
from typing import Any

from ..config import HEARTBEAT_INTERVAL
from . import keys
from .pulse import Beat, beat_from, judge
from .records import Registration
from .store import StoreClient

DEAD_AFTER = 5 * HEARTBEAT_INTERVAL  # seconds without a heartbeat before a rank counts as gone
WATCHED = 16  # a look reads the beats of the ranks that follow this one round the ring, up to this many,
ROTATED = 16  # and this many of the others in turn: in a world of up to WATCHED + 1 ranks, every peer, every look


def looked_at(me: int, size: int, turn: int) -> tuple[list[int], int]:
    """The peers that rank ``me``'s look number ``turn`` reads (in a world of ``size``), and the next look's turn.

    Each look reads the :data:`WATCHED` ranks after ``me`` round the ring (every peer, in a world of up to
    ``WATCHED + 1``), and :data:`ROTATED` of the rest in turn. So each rank is read by its ``WATCHED`` ring
    predecessors every look, and by every waiting rank now and then: a world where N-1 ranks wait reads about
    N * 32 beats a look, not N², and a dead rank is found as soon as one of its predecessors waits (and tells the
    others: it closes the meeting, or the cell's failure record says it); a rank whose predecessors are all
    elsewhere (idle peer notebooks) is still found by every waiting rank within a few rounds of the rest.
    """
    ring = [(me + k) % size for k in range(1, size)]
    watched, rest = ring[:WATCHED], ring[WATCHED:]
    if not rest:
        return watched, 0
    turn %= len(rest)
    take = min(ROTATED, len(rest))
    return watched + [rest[(turn + k) % len(rest)] for k in range(take)], turn + take


class PeerTracker:
    """Which other ranks are gone, by their heartbeats as this rank's own clock sees them move.

    A kernel's heartbeat is written by its pulse (:mod:`nbdist.world.pulse`), a small
    process that beats while the kernel's process lives, even when the kernel's
    Python is busy in one long C call; the beat says how long the kernel's own
    Python has not run (``busy``), and says ``gone`` when the kernel died.
    So a rank is dead when its beat says gone, or stops moving (its host or
    network is unreachable); a beat that moves is alive, however busy.
    """

    def __init__(self, ranks: list[Registration], me: int) -> None:
        self.ranks = ranks
        self.me = me
        self._peers = {i: r.session for i, r in enumerate(ranks) if i != me}
        self._turn = 0
        self._seen: dict[int, tuple[Any, float]] = {}
        # Peers whose beat is in the store and stays there (a kernel of this version leaves its last beat when it
        # stops: Heartbeat.stop): read together, in one multi_get, which would wait for a key that is not there.
        self._kept: set[int] = set()

    def beats(self, client: StoreClient, of: list[int] | None = None) -> dict[int, Beat | None]:
        """The beats (:func:`.pulse.beat_from`) of the peers ``of`` (None: those this look reads, :func:`looked_at`):
        those known to stay in one ``multi_get``, the others one by one until theirs is seen (one that registered
        without ``keeps_beat``, of the version before, every time). Peers that keep their beat but were not seen yet
        are first looked for together (one ``check``): when every one has beaten, as in a world that formed a moment
        ago, they join the ``multi_get`` at once, and a large world's first look costs two reads, not one per
        peer."""
        if of is None:
            of, self._turn = looked_at(self.me, len(self.ranks), self._turn)
        peers = {i: self._peers[i] for i in sorted(of) if i in self._peers}
        unseen = [i for i in peers if i not in self._kept and self.ranks[i].keeps_beat]
        if len(unseen) > 1 and client.check([keys.heartbeat(peers[i]) for i in unseen]):
            self._kept.update(unseen)
        kept = [i for i in peers if i in self._kept]
        texts = client.multi_get([keys.heartbeat(peers[i]) for i in kept]) if kept else []
        beats = {i: beat_from(t) for i, t in zip(kept, texts, strict=True)}
        for i, session in peers.items():
            if i not in beats:
                text = client.get_if(keys.heartbeat(session))
                if text is not None and self.ranks[i].keeps_beat:
                    self._kept.add(i)
                beats[i] = beat_from(text)
        return beats

    def dead(self, client: StoreClient, of: list[int] | None = None) -> list[tuple[int, str]]:
        """(rank, why) of the ranks that are gone or unreachable, of those read (``of``, as :meth:`beats`)."""
        beats = self.beats(client, of)
        # Taken after the reads: a look that reads for longer than DEAD_AFTER (one read per peer, in a large world on
        # a busy server) would otherwise date what it read to before it read it, and the next look call them dead.
        now = time.monotonic()
        gone = []
        for i, beat in beats.items():
            n = None if beat is None else beat.n
            last_n, since = self._seen.get(i, (n, now))
            if n != last_n or i not in self._seen:
                since = now
            self._seen[i] = (n, since)
            state, seconds = judge(beat, now - since, DEAD_AFTER)
            if state == "gone":
                what = "its nbdist follow process" if self.ranks[i].process == "nbdist follow" else "its kernel"
                gone.append((i, f"is gone: {what} exited or was killed"))
            elif state == "dead":
                gone.append((i, f"stopped responding: no heartbeat for {seconds:.0f} s (its kernel, host or "
                                "network went away)"))
        return gone
