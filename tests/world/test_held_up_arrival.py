"""A rank held up between noting its arrival at a meeting and deciding it, while another waits past its deadline:
replayed on a real server over real TCP, two worlds in one process.

The suite met it in ``test_breakpoints``: rank 1 left its debugger and reached the body's first all_reduce as rank 0,
long past its 3 s --timeout, looked once more at the ranks missing there. Rank 1's note already said it waited at
the comparison, rank 1 had not yet counted itself in and decided, and rank 0 gave up: "Missing: none (they arrived
as this rank gave up)". The explorer's ``compare-stall`` finds the same at every barrier of a cell.
"""

from __future__ import annotations

import threading
import time

import pytest

from nbdist.errors import PeerFailedError
from nbdist.world import gather, keys
from nbdist.world.gather import Gathering
from nbdist.world.store import StoreClient

NAME, LABEL, TIMEOUT = "fp-1", "collective #1 (all_reduce) of this cell", 0.5


class Waiting:
    """Rank 0 waiting at the meeting in a thread; ``looks`` counts the slices of its wait past its deadline."""

    def __init__(self, world, working=None) -> None:
        self.world, self.looks, self.result = world, threading.Semaphore(0), list[object]()
        self.waits = threading.Event()  # it counted itself in, and waits
        self.deadline = time.monotonic() + TIMEOUT
        g = Gathering(NAME, LABEL, TIMEOUT, working=working, on_tick=self._tick)
        self.thread = threading.Thread(target=self._run, args=(g,), daemon=True)
        self.thread.start()

    def _tick(self) -> None:
        self.waits.set()
        if time.monotonic() > self.deadline:
            self.looks.release()

    def _run(self, g: Gathering) -> None:
        try:
            self.result.append(gather.barrier(self.world, g))
        except BaseException as exc:  # what the rank's cell would show
            self.result.append(exc)

    def past_deadline(self, looks: int = 3) -> None:
        """Return once the wait has had ``looks`` slices past its deadline (each one may read who is missing)."""
        for _ in range(looks):
            while not self.looks.acquire(timeout=0.1):
                if not self.thread.is_alive():
                    return  # it gave up: the test says so

    def ended(self) -> object:
        self.thread.join(60)
        assert not self.thread.is_alive(), "rank 0 still waits"
        return self.result[0]


class HeldUp(StoreClient):
    """A real connection on which its rank is held up just before it counts itself in (its note already written),
    until ``hold()`` returns."""

    def __init__(self, client: StoreClient, hold) -> None:
        super().__init__(client.host, client.port, client.raw())
        self.marker, self.hold = client.marker, hold

    def add(self, key: str, amount: int) -> int:
        if amount and key.endswith(keys.arrivals(NAME)):
            self.hold()
        return super().add(key, amount)


@pytest.mark.parametrize("working", [None, lambda i, last: False], ids=["no work counts", "the rank is not at work"])
def test_a_rank_held_up_after_its_note_is_not_missing_and_the_meeting_opens_for_both(two_worlds, working):
    first, held = two_worlds
    waiting = Waiting(first, working)
    held.client = HeldUp(held.client, waiting.past_deadline)
    opened = gather.barrier(held, Gathering(NAME, LABEL, TIMEOUT))
    assert opened.opened
    assert waiting.ended() == opened  # not WaitTimeout("... Missing: none (they arrived as this rank gave up)")


def test_a_last_rank_whose_verdict_raises_closes_the_meeting_so_no_one_waits_on_it(two_worlds):
    """Every note says every rank is there, so the others wait on for the decision: the decider that cannot decide
    must close the meeting with why."""
    first, last = two_worlds
    waiting = Waiting(first)
    assert waiting.waits.wait(60)  # rank 0 counted in first: rank 1 arrives last and decides

    def verdict():
        waiting.past_deadline(1)
        raise ValueError("a record it could not read")

    with pytest.raises(ValueError):
        gather.barrier(last, Gathering(NAME, LABEL, TIMEOUT, verdict=verdict))
    ended = waiting.ended()
    assert isinstance(ended, PeerFailedError), ended
    assert "could not decide (ValueError: a record it could not read)" in str(ended)
    assert last.notes.last(1).what.startswith(f"stopped waiting at {LABEL}")
