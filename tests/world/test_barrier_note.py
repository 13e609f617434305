"""What a rank's note reads as once a barrier opened, when the barrier opened right after that rank arrived: replayed
on a real server over real TCP, two worlds in one process.

CI met it with 16 ranks: a %%collective ended on every rank, and the %dist_status run at once in the driving
notebook showed one rank still "running %%collective #1". That rank had counted itself in at the cell's end, and the
last rank opened the meeting before the first one's note said it waited there, so its note was still the body's.
"""

from __future__ import annotations

from nbdist.world import gather
from nbdist.world.gather import Gathering
from nbdist.world.store import StoreClient


class OpensAfterArrival(StoreClient):
    """A real connection on which the other rank arrives last, and opens the meeting, the moment this one has
    counted itself in (its ``add`` on the meeting's arrivals returned)."""

    def __init__(self, client: StoreClient, name: str, other) -> None:
        super().__init__(client.host, client.port, client.raw())
        self.marker, self.name, self.other, self.seen = client.marker, name, other, []

    def add(self, key: str, amount: int) -> int:
        value = super().add(key, amount)
        if amount and key.endswith(f"{self.name}/n") and not self.seen:
            end = Gathering(self.name, "the cell's end", 5.0, then="finished the cell")
            self.seen.append(gather.barrier(self.other, end))
            self.seen.append(self.other.notes.last(1))
        return value


def test_a_rank_that_arrived_just_before_the_meeting_opened_reads_as_past_it(two_worlds):
    last, early = two_worlds  # rank 0 arrives last; rank 1 arrives first
    early.notes.write("running %%collective #1", cell=1, body="body")
    early.client = OpensAfterArrival(early.client, "end-1", last)
    opened = gather.barrier(early, Gathering("end-1", "the cell's end", 5.0, then="finished the cell"))
    verdict, note = early.client.seen
    assert opened == verdict and opened.opened
    assert note is not None and note.what == "finished the cell", note  # not "running %%collective #1"
    assert early.notes.last(1).what == "finished the cell"
