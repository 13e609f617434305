"""A hang inside DDP's backward (one rank does something else), at 8 ranks and at 2: the message the cell ends
with, and %dist_where while it hangs, name the collective, its group and the missing rank from torch's
Flight Recorder, and the ranks' stacks, merged."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from nbdist.drive import kernels

from .conftest import free_port, lend, ok, run_in_background

ANSI = re.compile(r"\x1b\[[0-9;]*m")
DDP = "%%collective\nmodel = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
NEXT = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n"


def skips_backward(rank: int, sleep: float, flags: str = "") -> str:
    """Every rank but ``rank`` runs DDP's backward (its gradient all_reduce); ``rank`` sleeps instead."""
    return (f"%%collective {flags}\nimport time\nloss = model(torch.ones(3, 4)).sum()\nif RANK != {rank}:\n"
            f"    loss.backward()\nelse:\n    time.sleep({sleep})\n")


def text(r: kernels.Result) -> str:
    return ANSI.sub("", r.text())


@pytest.fixture(scope="module")
def eight() -> Iterator[SimpleNamespace]:
    """One notebook driving seven spawned workers, with a DDP model on every rank."""
    k = kernels.Kernel()
    port = free_port()
    try:
        ok([k.execute("%load_ext nbdist", timeout=60)])
        ok([k.execute(f"%dist_init --spawn 8 --master-port {port}", timeout=300)])
        session = "get_ipython().magics_manager.registry['DistMagics'].session"
        token = ast.literal_eval(k.execute("", user_expressions={"t": f"{session}.config.token"}).expression("t"))
        ok([k.execute(DDP, timeout=120)])
        yield SimpleNamespace(kernel=k, port=port, token=token)
    finally:
        k.shutdown()


@pytest.mark.timeout(400)
def test_at_8_ranks_max_time_ends_a_ddp_backward_hang_naming_the_collective_group_and_missing_rank(eight):
    k = eight.kernel
    thread, box = run_in_background(k, skips_backward(7, 90, "--max-time 20"), timeout=300)
    report = ""
    for _ in range(60):  # nbdist where in a terminal, while it hangs
        done = subprocess.run([sys.executable, "-m", "nbdist.cli", "where", "--master-addr", "127.0.0.1",
                               "--master-port", str(eight.port), "--token", eight.token],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        report = done.stdout
        if "rank 7 missing" in report or "r" in box:
            break
        time.sleep(1)
    assert re.search(r"the default group: all_reduce #\d+ .*ranks 0-6 entered, rank 7 missing", report), report
    assert "8 answered" in report, report
    assert "├─ all but rank 7" in report and "cell line 5: loss.backward()" in report, report
    assert "└─ rank 7" in report and "cell line 7: time.sleep(90)" in report, report

    thread.join(300)
    r = box["r"]
    shown = text(r)
    assert r.status == "error" and r.error["ename"] == "MaxTimeError", r.error
    where = shown[shown.find("nbdist: where every rank was"):]
    assert where, shown
    assert re.search(r"the default group: all_reduce #\d+ .*ranks 0-6 entered, rank 7 missing", where), where
    assert "cell line 7: time.sleep(90)" in where, where
    assert "3.0" not in shown
    assert "8.0" in text(ok([k.execute(NEXT, timeout=180)])[0])  # the group was rebuilt: the next cell works


@pytest.fixture
def peers(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, NEXT)


@pytest.mark.timeout(300)
def test_at_2_ranks_the_stop_button_on_a_ddp_backward_hang_shows_where_every_rank_was(peers):
    ok(kernels.execute_all(peers, DDP, timeout=120))
    hung = [run_in_background(peers[i], skips_backward(1, 20), timeout=200) for i in range(2)]
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
    assert "cell line 7: time.sleep(20)" in where, where
    ok(kernels.execute_all(peers, NEXT, timeout=120))
