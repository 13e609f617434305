"""A hang inside DDP's backward (one rank does something else), at 8 ranks and at 2: the message the cell ends
with, and %dist_where while it hangs, name the collective, its group and the missing rank from torch's
Flight Recorder, and the ranks' stacks, merged.

The 8-rank case runs in tests/test_many_ranks.py, on that module's 8-rank world (forming one takes 15 s).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest

from nbdist.debug import where
from nbdist.drive import kernels
from nbdist.world import keys
from nbdist.world.store import connect

from .conftest import lend, ok, run_in_background

ANSI = re.compile(r"\x1b\[[0-9;]*m")
DDP = "%%collective\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"
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


@pytest.fixture
def store(shared):
    """The test's own connection to the world's store (the peers' world has no token)."""
    client = connect("127.0.0.1", shared.port)
    yield client
    client.close()


def wait_until(done: Callable[[], bool], what: str, hung: list, within: float = 60) -> None:
    """Until ``done()``, while the ``hung`` cells still run; fail naming ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        assert all("r" not in box for _, box in hung), [box["r"].error for _, box in hung if "r" in box]
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_at_2_ranks_the_stop_button_on_a_ddp_backward_hang_shows_where_every_rank_was(peers, store, tmp_path):
    ok(kernels.execute_all(peers, DDP, timeout=120))
    round_ = int(peers[0].execute("", user_expressions={"r": f"{SESSION}.world.round"}).expression("r"))
    step = keys.in_round(round_, keys.step(store.add(keys.in_round(round_, keys.TURN), 0) + 1))  # the next cell's
    asks = where.Keys(round_)
    n = store.add(asks.asks, 0) + 1
    # Rank 1 computes on (a stop on one rank of peer notebooks cuts the others' collectives, not their computing)
    # until rank 0 has taken the press; then the test lets it go.
    go = tmp_path / "go"
    code = (f"%%collective\nimport os, time\nloss = model(torch.ones(3, 4)).sum()\nif RANK != 1:\n"
            f"    loss.backward()\nelse:\n    while not os.path.exists({str(go)!r}):\n        time.sleep(0.2)\n")
    hung = [run_in_background(peers[i], code, timeout=200) for i in range(2)]
    wait_until(lambda: store.add(asks.answered(n), 0) == 2, "rank 0, stuck 5 s in the backward's all_reduce, asked "
               "where every rank is and both answered", hung)
    time.sleep(1)  # rank 0 turns the answers into its report (milliseconds)
    peers[0].interrupt()
    wait_until(lambda: store.get_if(keys.failed(step)) is not None, "rank 0 recorded its stop", hung)
    go.touch()
    for thread, _ in hung:
        thread.join(200)
    r = hung[0][1]["r"]
    shown = text(r)
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r.error
    assert "KeyboardInterrupt: this rank's cell was stopped" in shown, shown  # one line, no frames of nbdist
    where_ = shown[shown.find("nbdist: where every rank was"):]
    assert re.search(r"the default group: all_reduce #\d+ .*rank 0 entered, rank 1 missing", where_), shown
    assert "cell line 8: time.sleep(0.2)" in where_, where_
    ok(kernels.execute_all(peers, NEXT, timeout=120))
