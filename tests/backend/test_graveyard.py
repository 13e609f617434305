"""A process group nbdist replaced (a rebuild, a stop) may still have a collective pending in gloo: its destructor then
waits for that collective, up to the group's timeout, wherever the group's last reference goes. An earlier cell's
traceback, which IPython keeps, holds the group in its frames, and the garbage collection that frees it runs on the
kernel's main thread in the middle of the next cell: that cell waited out the timeout (the fuzzed soak met it, about
once in 80 presses of the stop button). Real gloo groups, two ranks in one process, on a real TCPStore."""

from __future__ import annotations

import gc
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from nbdist.backend import procgroup

PENDING = 20.0  # seconds the collective left pending waits for the rank that never sends


@pytest.fixture
def pair(port):
    # A client per rank: one client's wait would hold the other rank's calls back.
    stores = [dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False,
                            timeout=timedelta(seconds=30)) for rank in (0, 1)]
    groups: list = [None, None]

    def make(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("g/", stores[rank]), rank, 2, timedelta(seconds=PENDING))

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(g is not None for g in groups), "the two gloo ranks did not connect"
    yield groups
    groups.clear()


class Frame:
    """What a kept traceback's frames are to the group: a reference inside a cycle, freed only by the collector."""

    def __init__(self, group: object) -> None:
        self.group, self.me = group, self


def test_a_buried_group_with_a_collective_left_pending_is_not_destroyed_on_the_thread_that_collects_it(pair):
    pair[0].allreduce([torch.ones(1)])  # rank 1 never joins it: gloo's thread waits for it
    held = Frame(pair[0])
    procgroup.bury([pair[0]])
    pair[0] = None
    del held
    started = time.monotonic()
    gc.collect()  # the last reference but the graveyard's goes here, as in IPython's traceback formatting
    took = time.monotonic() - started
    assert took < PENDING / 2, f"the collection waited {took:.1f} s for the group's pending collective"
