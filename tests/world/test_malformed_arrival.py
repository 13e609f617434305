"""A record at a step's meeting that is not nbdist's refuses the meeting on every rank, naming whose it is.

Anyone who reaches the store's port can write there. Before the records were typed, the last rank to arrive
met such a record with a ``KeyError`` in its decision, which left the step to its own rank's abort; now it
refuses the meeting, as ranks that reached different steps are, and every rank reads why.
"""

from __future__ import annotations

import threading

import pytest

from nbdist.world import gather, keys
from nbdist.world.gather import BarrierRefused
from nbdist.world.records import Arrival
from nbdist.world.world import step_name

WAIT = 30.0


def test_a_foreign_record_at_a_step_refuses_the_meeting_on_every_rank_naming_its_rank(two_worlds):
    first, second = two_worlds
    n = first.turns.next()
    box: dict[str, BaseException] = {}

    def meet() -> None:
        try:
            gather.meet(first, n, Arrival("barrier", f"%dist_barrier #{n}"), WAIT)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box["error"] = exc

    waiting = threading.Thread(target=meet, daemon=True)
    waiting.start()
    while first.client.add(first.key(keys.arrivals(keys.arrival(n))), 0) < 1:
        waiting.join(0.01)  # rank 0 is counted in, and waits
    # Rank 1's record is overwritten as it arrives: gather.meet writes its own, then this lands before it is counted.
    real = second.client

    class Overwritten:
        def __getattr__(self, name: str):  # everything else: the real connection
            return getattr(real, name)

        def set(self, key: str, value: str) -> None:
            real.set(key, value)
            if key == second.key(keys.record(step_name(n), 1)):
                real.set(key, '{"kind": "barrier", "label": 7}')

    second.client = Overwritten()
    with pytest.raises(BarrierRefused) as caught:
        gather.meet(second, n, Arrival("barrier", f"%dist_barrier #{n}"), WAIT)
    waiting.join(WAIT)
    assert not waiting.is_alive()
    why = "the records of this step are not all nbdist's (rank 1: not nbdist's: its 'label' is 7, not text)"
    assert str(caught.value).startswith(why), caught.value
    assert isinstance(box.get("error"), BarrierRefused) and str(box["error"]) == str(caught.value)
    assert first.turns.next() == n + 1  # the step was taken: both ranks meet at the next one
