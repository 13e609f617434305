"""A hang inside DDP's backward (one rank does something else), at 8 ranks and at 2: the message the cell ends
with, and %dist_where while it hangs, name the collective, its group and the missing rank from torch's
Flight Recorder, and the ranks' stacks, merged.

The 8-rank case runs in tests/test_many_ranks.py, on that module's 8-rank world (forming one takes 15 s).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import lend, ok, run_in_background

ANSI = re.compile(r"\x1b\[[0-9;]*m")
DDP = "%%collective\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
NEXT = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n"


def skips_backward(rank: int, sleep: float, flags: str = "") -> str:
    """Every rank but ``rank`` runs DDP's backward (its gradient all_reduce); ``rank`` sleeps instead."""
    return (f"%%collective {flags}\nimport time\nloss = model(torch.ones(3, 4)).sum()\nif RANK != {rank}:\n"
            f"    loss.backward()\nelse:\n    time.sleep({sleep})\n")


def text(r: kernels.Result) -> str:
    return ANSI.sub("", r.text())


@pytest.fixture
def peers(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, NEXT)


@pytest.mark.timeout(300)
def test_at_2_ranks_the_stop_button_on_a_ddp_backward_hang_shows_where_every_rank_was(peers):
    ok(kernels.execute_all(peers, DDP, timeout=120))
    # Rank 1's sleep runs to its end (a stop on one rank of peer notebooks cuts the others' collectives, not
    # their computing), so it is no longer than the press needs: rank 1 still sleeps 4 s after it.
    hung = [run_in_background(peers[i], skips_backward(1, 14), timeout=200) for i in range(2)]
    time.sleep(10)  # rank 0 asks every rank where it is once it has waited 5 s in the backward's all_reduce
    peers[0].interrupt()
    for thread, _ in hung:
        thread.join(200)
    r = hung[0][1]["r"]
    shown = text(r)
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r.error
    assert "KeyboardInterrupt: this rank's cell was stopped" in shown, shown  # one line, no frames of nbdist
    where = shown[shown.find("nbdist: where every rank was"):]
    assert re.search(r"the default group: all_reduce #\d+ .*rank 0 entered, rank 1 missing", where), shown
    assert "cell line 7: time.sleep(14)" in where, where
    ok(kernels.execute_all(peers, NEXT, timeout=120))
