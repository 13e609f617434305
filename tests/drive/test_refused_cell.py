"""A follower refuses a driven cell: the driver waiting at that cell's step is told at once, and a number that is
not the world's step closes nothing. Real server, real TCP, two worlds in one process (the driver in a thread)."""

from __future__ import annotations

import threading

import pytest

from nbdist.cell import turn
from nbdist.errors import PeerFailedError
from nbdist.world import gather, keys
from nbdist.world import verdict as verdicts
from nbdist.world.records import Arrival, CellStart
from nbdist.world.world import World, step_name

WAIT = 60.0  # the driver's --timeout: a refusal that closes nothing leaves it waiting this long


@pytest.fixture
def pair(two_worlds):
    return two_worlds  # (rank 0, rank 1), both just joined


def _state(world: World, n: int) -> verdicts.Verdict | None:
    return verdicts.decode(world.client.get_if(world.key(keys.state(keys.arrival(n)))))


def test_the_driver_waiting_at_the_refused_cells_step_is_told_why(pair):
    driver, follower = pair
    n = driver.turns.next()  # the step the driver claimed and sent its cell for
    box: dict[str, BaseException] = {}

    def meet() -> None:
        try:
            start = CellStart("h", "x = 1", {"ok": True}, {})
            gather.meet(driver, n, Arrival("cell", f"%%collective #{n} (start)", start), WAIT)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box["error"] = exc

    waiting = threading.Thread(target=meet, daemon=True)
    waiting.start()
    while not driver.client.check([driver.key(keys.record(step_name(n), 0))]):
        waiting.join(0.01)  # the driver is at its meeting
    turn.refuse_sent(follower, n, "refused the cell: its signature does not verify")
    waiting.join(WAIT / 2)
    assert not waiting.is_alive(), "the driver still waits at the refused cell's step"
    error = box["error"]
    assert isinstance(error, PeerFailedError), error
    assert "rank 1 (h, pid 2) refused the cell: its signature does not verify" in str(error)
    failed = follower.client.get_json_if(follower.key(keys.failed(step_name(n))))
    assert failed is not None and failed["rank"] == 1 and "unstarted" not in failed
    assert driver.turns.next() == n + 1  # the world is past the refused step: every rank's next cell meets at n + 1


@pytest.mark.parametrize("number", ["past", "to come", "text", "true", "none"])
def test_a_number_that_is_not_the_worlds_step_closes_nothing(pair, number):
    driver, follower = pair
    n = driver.turns.next()
    sent = {"past": n - 1, "to come": n + 2, "text": str(n), "true": True, "none": None}[number]
    turn.refuse_sent(follower, sent, "refused the cell: its signature does not verify")
    assert driver.turns.next() == n
    for step in (n - 1, n, n + 2):
        assert _state(driver, step) is None
        assert follower.client.get_if(follower.key(keys.failed(step_name(step)))) is None
