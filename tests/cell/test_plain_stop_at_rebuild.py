"""A plain cell stopped in its first collective's wrapper, before torch's count of collectives moved: in nbdist's
store reads there (who drives, the world's generation) or as the rebuild that every rank took part in ends (a stop
is held through it and raised then). The others wait in their collective for it, so it must tell them. Real
server, real TCP, two worlds in one process; the plain cell's real watcher (nbdist.cell.plain), without a kernel.

The fuzzed long soak met it once (plain mode, seed 336, fault 10: the stop button on one rank in a loop of
all_reduce): the stopped cell told nobody, as it had started no collective by torch's count, and the other rank
waited in its all_reduce for good; its next cell's all_reduce paired with the stopped rank's next one, out of step.
The soak shows no more than that (its where-report: one rank in all_reduce, the other idle); the fuzzed store reads
of that wrapper are the window where a stop lands in such a cell and leaves it so.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nbdist.cell.hooks import Collectives
from nbdist.cell.plain import PlainNet
from nbdist.cell.stopper import Stopper
from nbdist.cell.watch import plain_failure
from nbdist.world.world import World


def _net(world: World, ensure_group: Any) -> PlainNet:
    """The plain-cell watcher of a kernel in ``world``, in no drive, that rebuilds with ``ensure_group``."""
    link = SimpleNamespace(world=world, watch_client=world.client.clone())
    driving = SimpleNamespace(process="kernel", drive=SimpleNamespace(holding=False, has_followers=lambda world: False))
    return PlainNet(link, Collectives(), Stopper(), driving, ensure_group)


def test_a_plain_cell_stopped_as_its_first_collectives_rebuild_ends_tells_the_others(two_worlds):
    stopped, waiting = two_worlds

    def rebuilt_then_stopped() -> None:
        raise KeyboardInterrupt  # the press held through the rebuild (nbdist.cell.rebuild.ensure), raised as it ends

    net = _net(stopped, rebuilt_then_stopped)
    try:
        net.begin("t = torch.ones(1)\ndist.all_reduce(t)\n")
        with pytest.raises(KeyboardInterrupt):
            net.checker()
        net.end(KeyboardInterrupt())
    finally:
        net.link.watch_client.close()
    told = plain_failure(waiting.client, waiting, 0)
    assert told is not None, "the stopped rank told nobody: the other waits in its collective for good"
    assert told.rank == stopped.rank and "the stop button" in told.message, told


def test_a_plain_cell_that_reached_no_collective_tells_nobody(two_worlds):
    stopped, waiting = two_worlds
    net = _net(stopped, lambda: None)
    try:
        net.begin("x = 1\n")
        net.end(KeyboardInterrupt())
    finally:
        net.link.watch_client.close()
    assert plain_failure(waiting.client, waiting, 0) is None
