"""%dist_where and nbdist where on real kernels: a driven world of 2 whose rank 0 hangs in an all_reduce."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from nbdist.drive import kernels

from .conftest import REAPER, free_port, lend, ok, run_in_background

SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"
# Rank 1 skips the all_reduce rank 0 enters: rank 0 hangs in it (--no-check: nbdist's own check would refuse it).
HANG = "%%collective --no-check\nx = torch.ones(3)\nif RANK == 0:\n    dist.all_reduce(x)\nprint('done', RANK)\n"
PARTED = ("├─ rank 0", "cell line 4: dist.all_reduce(x)", "└─ rank 1", "barrier  (nbdist/world/gather.py")
MISSING = re.compile(r"the default group: all_reduce #\d+ \(sizes \[\[3\]\]\): rank 0 entered, rank 1 missing")


@pytest.fixture
def peers(shared) -> Iterator[list[kernels.Kernel]]:
    """The module's shared world of two peer notebooks (no token: signed with the server's key file)."""
    yield from lend(shared, "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)")


@pytest.fixture(scope="module")
def driven() -> Iterator[SimpleNamespace]:
    """One notebook driving a spawned worker (``%dist_init --spawn 2``), and the world's port and token."""
    k = kernels.Kernel()
    try:
        ok([k.execute("%load_ext nbdist", timeout=60)])
        port = free_port()
        ok([k.execute(f"%dist_init --spawn 2 --master-port {port}", timeout=180)])
        token = ast.literal_eval(k.execute("", user_expressions={"t": f"{SESSION}.config.token"}).expression("t"))
        yield SimpleNamespace(kernel=k, port=port, token=token)
    finally:
        REAPER.later([k])


def where_in_a_terminal(driven: SimpleNamespace, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbdist.cli", "where", "--master-addr", "127.0.0.1",
                           "--master-port", str(driven.port), "--token", driven.token, *flags],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
def test_a_hang_in_all_reduce_is_named_by_collective_group_and_missing_rank_and_the_stop_button_ends_it(driven):
    k = driven.kernel
    thread, box = run_in_background(k, HANG, timeout=240)
    report = ""
    for _ in range(60):  # until rank 0 is inside the all_reduce and rank 1 past the body (each run takes seconds)
        done = where_in_a_terminal(driven)
        assert done.returncode == 0, done.stderr
        report = done.stdout
        if MISSING.search(report) and all(part in report for part in PARTED):
            break
        assert "r" not in box, box["r"].error
    assert MISSING.search(report), report
    assert "2 answered" in report, report
    tree = report.split("Python stacks")[1].split("Flight Recorder")[0]
    # both ranks' stacks, parted: rank 0 at the cell's line inside all_reduce, rank 1 at the cell's end barrier
    rank0 = tree.split("├─ rank 0")[1].split("└─ rank 1")[0]
    rank1 = tree.split("└─ rank 1")[1]
    assert "cell line 4: dist.all_reduce(x)" in rank0, report
    assert "barrier  (nbdist/world/gather.py" in rank1, report
    k.interrupt()  # the stop button ends the stuck cell
    thread.join(120)
    r = box["r"]
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r.error
    assert "done 1" in r.text()
    again = ok([k.execute("%%collective\nx = torch.ones(1)\ndist.all_reduce(x)\nprint(x.item())", timeout=120)])[0]
    assert "2.0" in again.text()


@pytest.mark.timeout(200)
def test_dist_where_in_the_idle_driving_notebook_shows_both_ranks_with_native_frames_or_why_not(driven):
    r = ok([driven.kernel.execute("%dist_where --native --threads", timeout=120)])[0]
    text = r.text()
    assert "nbdist where · 2 rank(s) · 2 answered" in text, text
    assert "with native frames (py-spy)" in text, text
    assert "[native]" in text or "Native frames missing on" in text, text
    assert "cell line 1: get_ipython().run_line_magic('dist_where'" in text, text  # the driver runs this magic
    assert "dist_follow" in text, text  # the worker follows
    assert "Flight Recorder (torch's analyser), per process group:" in text, text


def test_help_and_a_bad_timeout_are_one_line(driven):
    k = driven.kernel
    help_text = "".join(p.get("data", {}).get("text/plain", "") for p in k.execute("%dist_where?").payload)
    assert "Flight Recorder" in help_text and "--native" in help_text, help_text
    r = k.execute("%dist_where --timeout 0", timeout=30)
    assert r.status == "error" and r.error["ename"] == "UsageError", r.error
    assert "\n" not in r.error["evalue"], r.error


@pytest.mark.timeout(200)
def test_in_a_peer_world_an_idle_notebook_sees_the_other_busy_in_a_plain_cell_and_the_groups_in_step(peers):
    busy = "import threading\nthreading.Event().wait(600)  # busy until the stop button\n"
    thread, box = run_in_background(peers[1], busy, timeout=180)
    try:
        text = ""
        for _ in range(60):  # until rank 1's cell has begun
            text = ok([peers[0].execute("%dist_where", timeout=60)])[0].text()
            if "cell line 2: threading.Event().wait(600)" in text:
                break
            assert "r" not in box, box["r"].error
    finally:
        peers[1].interrupt()
        thread.join(60)
    assert "nbdist where · 2 rank(s) · 2 answered" in text, text
    rank1 = text.split("└─ rank 1")[1].split("Flight Recorder")[0]
    assert "cell line 2: threading.Event().wait(600)  # busy until the stop button" in rank1, text
    assert "cell line 1: get_ipython().run_line_magic('dist_where', '')" in text.split("└─ rank 1")[0], text
    assert re.search(r"the default group: in step; last completed on every member: all_reduce #\d+", text), text
    assert box["r"].error["ename"] == "KeyboardInterrupt", box["r"].error
