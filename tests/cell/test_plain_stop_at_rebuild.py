"""A plain cell stopped once its first collective's rebuild, which every rank took part in, has ended: the others,
past that rebuild, wait in their collective for it, so it must tell them. Real server, real TCP, two worlds in
one process; the plain cell's real watcher (nbdist.cell.plain), without a kernel.

The fuzzed long soak met it (plain mode, seed 336, a stop of one rank in a loop of all_reduce): the stop was held
through the rebuild of the cell's first collective and raised as it ended, before the collective started; the
cell had started no collective by torch's count, so it told nobody, and the other rank waited in its all_reduce
for good (its next cell's all_reduce then paired with the stopped rank's next one, out of step).
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


def _host(world: World, ensure_group: Any) -> SimpleNamespace:
    """What the plain-cell watcher needs of a kernel's session (:class:`nbdist.cell.plain.PlainHost`)."""
    drive = SimpleNamespace(holding=False, has_followers=lambda world: False)
    return SimpleNamespace(world=world, watch_client=world.client.clone(), hooks=Collectives(), stopper=Stopper(),
                           process="kernel", drive=drive, ensure_group=ensure_group)


def test_a_plain_cell_stopped_as_its_first_collectives_rebuild_ends_tells_the_others(two_worlds):
    stopped, waiting = two_worlds

    def rebuilt_then_stopped() -> None:
        raise KeyboardInterrupt  # the press held through the rebuild (nbdist.cell.rebuild.ensure), raised as it ends

    host = _host(stopped, rebuilt_then_stopped)
    net = PlainNet(host)
    try:
        net.begin("t = torch.ones(1)\ndist.all_reduce(t)\n")
        with pytest.raises(KeyboardInterrupt):
            net.checker()
        net.end(KeyboardInterrupt())
    finally:
        host.watch_client.close()
    told = plain_failure(waiting.client, waiting, 0)
    assert told is not None, "the stopped rank told nobody: the other waits in its collective for good"
    assert told["rank"] == stopped.rank and "the stop button" in told["message"], told


def test_a_plain_cell_that_reached_no_collective_tells_nobody(two_worlds):
    stopped, waiting = two_worlds
    host = _host(stopped, lambda: None)
    net = PlainNet(host)
    try:
        net.begin("x = 1\n")
        net.end(KeyboardInterrupt())
    finally:
        host.watch_client.close()
    assert plain_failure(waiting.client, waiting, 0) is None
