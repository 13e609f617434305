"""The guard hands a stop of every rank to the cell that ran when it was sent, never to the next one (real store)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from nbdist.cell.guard import Guard, request_stop
from nbdist.world import keys
from nbdist.world.store import Server, connect


@pytest.fixture
def guarded(port) -> Iterator[SimpleNamespace]:
    """A real server, a client that sends stops, and a guard of rank 1 that looks only when told (``look()``)."""
    server = Server("127.0.0.1", port)
    client = connect("127.0.0.1", port)
    stops: list = []
    guard = Guard(connect("127.0.0.1", port), lambda name: f"r/0/{name}", 1, "me", stops.append, start=False)

    def begin() -> None:
        guard.new_cell()
        guard.running = True

    try:
        yield SimpleNamespace(guard=guard, stops=stops, look=guard._look, begin=begin,
                              stop=lambda by, session="them": request_stop(client, 0, by, session))
    finally:
        guard.stop()
        client.close()
        server.stop()


def test_a_stop_sent_during_a_cell_that_ended_before_the_guard_looked_is_not_for_the_next_cell(guarded):
    g = guarded
    g.begin()
    g.look()  # the guard sees cell 1 running
    g.stop("rank 0 with %dist_stop")
    g.guard.running = False  # cell 1 ends (its peers stopped first) before the guard looks again
    time.sleep(0.01)
    g.begin()  # and cell 2 begins
    g.look()
    assert g.stops == []
    g.stop("rank 0 with %dist_stop")  # sent during cell 2: it is for cell 2
    g.look()
    assert [s.message for s in g.stops] == ["stopped by rank 0 with %dist_stop"]


def test_a_stop_sent_just_after_a_cell_began_reaches_it_before_the_guard_ever_saw_it_running(guarded):
    g = guarded
    g.begin()
    time.sleep(0.01)
    g.stop("nbdist stop in a terminal", "")
    g.look()
    assert len(g.stops) == 1
    g.stop("this notebook itself", "me")  # its own %dist_stop: not for its own cell
    g.look()
    assert len(g.stops) == 1


def test_a_stop_while_no_cell_runs_is_for_nobody(guarded):
    g = guarded
    g.stop("rank 0 with %dist_stop")
    g.look()
    g.begin()
    g.look()
    assert g.stops == []


def test_a_stop_record_that_is_not_one_is_passed_over_and_the_next_real_stop_still_reaches_the_cell(guarded, port):
    """Anyone can count a stop and write its record: one that is not a stop neither stops the cell nor stalls the
    guard on it (before, a ``t`` that was not a number failed each look at the same record)."""
    g = guarded
    g.begin()
    g.look()
    writer = connect("127.0.0.1", port)
    try:
        for text in ("not json", '{"message": "x", "t": "now"}', '{"t": 1}'):
            n = writer.add("r/0/" + keys.STOPS, 1)
            writer.set("r/0/" + keys.stop(n), text)
        g.look()
        assert g.stops == []
        g.stop("rank 0 with %dist_stop")
        g.look()
        assert [s.message for s in g.stops] == ["stopped by rank 0 with %dist_stop"]
    finally:
        writer.close()
