"""A notebook's first cell in a world with ``nbdist follow`` ranks that do not yet count themselves as followers
(they joined a moment ago): it is published for them, and they take it, rather than run in lockstep without them
(the driver then waited at the cell's start for ranks that never ran it). Real server, real TCP, worlds in one
process."""

from __future__ import annotations

import pytest

from nbdist.drive.follow import Drive, Follower, followers
from nbdist.world import keys
from nbdist.world.records import Registration
from nbdist.world.store import Server, connect
from nbdist.world.world import World

SECRET = "the world's secret"
BODY = "x = RANK\n"


def _ranks(process: str) -> list[Registration]:
    return [Registration(session="s0", rank=0, host="h", pid=1, process="kernel"),
            Registration(session="s1", rank=1, host="h", pid=2, process=process)]


@pytest.fixture
def store(port):
    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(2)]
    try:
        yield clients
    finally:
        for c in clients:
            c.close()
        server.stop()


def _pair(clients, process: str) -> tuple[World, World]:
    ranks = _ranks(process)
    driver, other = (World(c, 0, i, 2, ranks[i], ranks) for i, c in enumerate(clients))
    driver.last_turn = other.last_turn = driver.turns.next() - 1
    return driver, other


def test_the_first_cell_is_published_for_an_nbdist_follow_rank_that_follows_a_moment_later(store):
    driver, world = _pair(store, "nbdist follow")
    drive = Drive("s0")
    assert followers(driver) == 0  # it joined, and has not said it follows yet
    step = driver.turns.next()
    drive.before(driver, lambda: SECRET, "collective", BODY, {"timeout": 5.0}, step=step)
    assert drive.holding and driver.client.check([driver.key(keys.drive(1))])
    with Follower(world, "s1", SECRET) as follower:  # now it follows: the cell is the first it takes
        got = follower.next()
    assert (got.seq, got.kind, got.source, got.number) == (1, "collective", BODY, step)


def test_with_only_notebooks_the_first_cell_runs_in_lockstep(store):
    driver, _ = _pair(store, "kernel")
    drive = Drive("s0")
    drive.before(driver, lambda: SECRET, "collective", BODY, {"timeout": 5.0}, step=driver.turns.next())
    assert not drive.holding and not driver.client.check([driver.key(keys.drive(1))])
