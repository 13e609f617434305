"""What each rank of a world last did (its note, ``last/<i>``: :class:`.records.Note`), and what a rank does now, in
words. A rank writes its note as it goes (joining, running a cell, waiting at a barrier, in its debugger); the others
read it for the messages of their waits that give up, for ``%dist_status``, and for a barrier's rule of who still
works towards it (:attr:`nbdist.world.gather.Gathering.working`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol

from . import keys
from . import verdict as verdicts
from .records import Busy, Note
from .store import StoreClient


class Seat(Protocol):
    """What the notes read of their world (:class:`nbdist.world.world.World`): its connection, its round's keys
    and this rank. Read at each call: a test may wrap the connection after the world was made."""

    client: StoreClient
    rank: int

    def key(self, name: str) -> str: ...


class Notes:
    """The notes of one world's ranks: this rank's written, any rank's read."""

    def __init__(self, seat: Seat) -> None:
        self._seat = seat
        self._noted: set[int] = set()  # ranks seen to have a note (last/<i>): it is never taken back

    def write(self, what: str, *, barrier: str | None = None, then: str | None = None, turn: int | None = None,
              cell: int | None = None, body: str | None = None) -> None:
        """Record what this rank is doing, for other ranks' timeouts and status (:class:`.records.Note`)."""
        s = self._seat
        note = Note(what, time.time(), barrier=barrier, then=then, turn=turn, cell=cell, body=body)
        s.client.set(s.key(keys.last(s.rank)), note.to_json())

    def of(self, rank: int) -> Note | None:
        """``rank``'s note as it is (None: none yet, or not a note)."""
        s = self._seat
        return Note.read(s.client.get_if(s.key(keys.last(rank))))

    def last(self, rank: int) -> Note | None:
        """What ``rank`` last recorded; a wait at a barrier that has opened since reads as passed it.

        A rank records its next activity only once it runs again, so right after a cell the
        slowest rank's record may still say it waits at the cell's end, which is over.
        """
        last = self.of(rank)
        if last is None or not last.barrier or not last.then:
            return last
        s = self._seat
        decided = verdicts.decode(s.client.get_if(s.key(keys.state(last.barrier))))
        return replace(last, what=last.then) if decided is not None and decided.opened else last

    def of_ranks(self, ranks: list[int]) -> dict[int, Note | None]:
        """The notes of ``ranks`` (None: none yet, or not a note), as they are, in rank order: those of the ranks
        seen to have one in one ``multi_get`` (a note is replaced, never removed), the others one by one until
        they have one."""
        s = self._seat
        known = [i for i in ranks if i in self._noted]
        texts = s.client.multi_get([s.key(keys.last(i)) for i in known]) if known else []
        found: dict[int, Note | None] = {i: Note.read(t) for i, t in zip(known, texts, strict=True)}
        for i in ranks:
            if i not in found:
                text = s.client.get_if(s.key(keys.last(i)))
                if text is not None:
                    self._noted.add(i)
                found[i] = Note.read(text)
        return {i: found[i] for i in ranks}

    def busy_elsewhere(self, i: int, last: Note | None) -> bool:
        """A ``working`` rule for barriers outside cells: rank ``i`` runs a cell, and waits at no barrier."""
        s = self._seat
        busy = Busy.read(s.client.get_if(s.key(keys.busy(i))))
        return busy is not None and busy.busy and (last is None or last.barrier is None)

    def doing(self, i: int) -> str:
        """What rank ``i`` does now, in words, for the message of a wait that gives up on it."""
        return self.doing_as(i, self.of(i))

    def doing_as(self, i: int, last: Note | None) -> str:
        """:meth:`doing`, from rank ``i``'s note as already read."""
        s = self._seat
        busy = Busy.read(s.client.get_if(s.key(keys.busy(i))))
        state = ""
        waits = last is not None and last.barrier is not None
        if busy is not None and not busy.busy and not waits:
            state = f"idle since {time.strftime('%H:%M:%S', time.localtime(busy.t))}; "
        elif busy is not None and busy.busy and not waits:
            state = "running a cell; "
        if last is None:
            return f"{state}no activity recorded"
        ago = max(0.0, time.time() - last.t)
        return f"{state}last: {last.what}, {ago:.0f} s ago"
