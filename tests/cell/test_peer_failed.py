"""A rank that fails its cell before a collective the others wait in: they must name its error, not a mismatch,
however its failure and its output interleave with their reads. Real server, real TCP, two worlds in one process."""

from __future__ import annotations

import json

import pytest

from nbdist.cell.fingerprint import Checker, raise_if_failed
from nbdist.cell.watch import publish
from nbdist.errors import CollectiveMismatchError, PeerFailedError
from nbdist.world import keys
from nbdist.world.records import Failure, Registration
from nbdist.world.store import Server, connect
from nbdist.world.world import World

RANKS = [Registration(session="s0", rank=0, host="h", pid=1), Registration(session="s1", rank=1, host="h", pid=2)]
CELL = "g0/c/1"


def _end_as_cells_does(world: World, error: dict | None) -> None:
    """What cells.run does at a body's end: the failure first (when it failed), then the output, then its arrival
    at the end meeting (the first thing its barrier does), which counts it among those that ended."""
    if error is not None:
        message = f"{world.describe(world.rank)} raised {error['ename']}: {error['evalue']}"
        publish(world.client, world, CELL, Failure(world.rank, "error", message))
    world.client.set(world.key(f"{CELL}/out/{world.rank}"),
                     json.dumps({"outputs": [], "result": None, "error": error, "wall": 0.1,
                                "collectives": {}}))
    world.client.add(world.key(keys.ended(CELL)), 1)


@pytest.mark.parametrize("error", [{"ename": "ZeroDivisionError", "evalue": "division by zero"}, None],
                         ids=["it-failed", "it-finished"])
def test_a_peer_that_ends_just_after_a_tick_read_its_failure_is_named_by_what_it_did(port, error):
    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(2)]
    try:
        waiter, peer = (World(c, 0, i, 2, RANKS[i], RANKS) for i, c in enumerate(clients))
        ticks = []

        def tick() -> None:  # the checker's own tick reads the failure key; the peer ends right after
            raise_if_failed(waiter, CELL)
            ticks.append(1)
            if len(ticks) == 1:
                _end_as_cells_does(peer, error)

        checker = Checker(waiter, CELL, 60, {}, on_tick=tick)
        with pytest.raises((PeerFailedError, CollectiveMismatchError)) as caught:
            checker._peer_finished("0", 1, {"op": "all_reduce"}, None)
        if error is not None:  # the failure is the cause: the missing all_reduce only follows from it
            assert caught.type is PeerFailedError, caught.value
            assert "raised ZeroDivisionError: division by zero" in str(caught.value), caught.value
        else:  # it finished cleanly without the call: that is a mismatch
            assert caught.type is CollectiveMismatchError, caught.value
            assert "finished this cell after 0 collective(s)" in str(caught.value), caught.value
    finally:
        for c in clients:
            c.close()
        server.stop()
