"""The world never falls out of step: every rank meets the others at the store's step, whatever a stop interrupted.

Each test is one reproduction from the acceptance run or an earlier note (issue 25), on one shared two-rank world.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels
from nbdist.world.store import connect

from .conftest import lend, ok, run_in_background

HOST = socket.gethostname()
ALL_REDUCE = "%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n"
PLAIN_ALL_REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n"
SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"


@pytest.fixture
def world(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, ALL_REDUCE.replace("60", "20"))


def round_of(kernel: kernels.Kernel) -> str:
    """The world round a kernel is in (ask while it is idle: a busy kernel answers only after its cell)."""
    return kernel.execute("", user_expressions={"r": f"{SESSION}.world.round"}).expression("r")


def note_of(shared, round_: str, rank: int) -> dict:
    client = connect("127.0.0.1", shared.port)
    try:
        return client.get_json_if(f"r/{round_}/last/{rank}") or {}
    finally:
        client.close()


def wait_for_note(shared, round_: str, rank: int, word: str, box: dict) -> None:
    deadline = time.monotonic() + 20
    while word not in note_of(shared, round_, rank).get("what", ""):
        assert time.monotonic() < deadline, f"rank {rank} never noted {word!r}: {note_of(shared, round_, rank)}"
        assert "r" not in box, box["r"].error
        time.sleep(0.05)


def stop_a_plain_all_reduce_on_rank_0(world: list[kernels.Kernel], shared, round_: str) -> None:
    """Rank 0: a plain all_reduce that rank 1 never joins, stopped inside it: its group is cut, the world moves on."""
    thread, box = run_in_background(world[0], PLAIN_ALL_REDUCE, timeout=60)
    wait_for_note(shared, round_, 0, "inside", box)
    world[0].interrupt()
    thread.join(timeout=30)
    assert box["r"].error["ename"] == "KeyboardInterrupt", box["r"].error


def works(ks: list[kernels.Kernel]) -> None:
    """Both a %%collective and a plain cell's collective run on every rank, with the right sum."""
    for cell in (ALL_REDUCE, PLAIN_ALL_REDUCE):
        for r in ok(kernels.execute_all(ks, cell, timeout=60)):
            assert "2.0" in r.text(), r.text()


@pytest.mark.timeout(120)
def test_a_rebuild_wait_keeps_the_cells_timeout_and_names_the_idle_rank_then_the_world_works(world, shared):
    stop_a_plain_all_reduce_on_rank_0(world, shared, round_of(world[0]))
    # Rank 1: a %%collective with --timeout 5 needs rank 0 to rebuild with it; rank 0 is idle.
    t0 = time.monotonic()
    r = world[1].execute("%%collective --timeout 5\nx = 1\n", timeout=60)
    took = time.monotonic() - t0
    assert r.status == "error" and r.error["ename"] == "WaitTimeout", r.error
    assert 4.5 < took < 30, took  # its own --timeout 5, not a longer wait
    message = r.error["evalue"]
    assert f"Missing: rank 0 ({HOST}, pid " in message and "idle since " in message, message
    assert "Every rank must rebuild the process group at this cell's start first" in message, message
    works(world)


@pytest.mark.timeout(120)
def test_a_rank_waiting_at_a_step_while_the_world_moves_on_rebuilds_there_with_the_others(world, shared):
    round_ = round_of(world[0])
    # Rank 1 waits at its cell's start with a group that is fine; then rank 0's plain collective fails the world.
    waiting, box = run_in_background(world[1], ALL_REDUCE, timeout=60)
    wait_for_note(shared, round_, 1, "waiting at %%collective", box)
    stop_a_plain_all_reduce_on_rank_0(world, shared, round_)
    assert waiting.is_alive(), "rank 1's cell ended while it waited for rank 0"
    mine = world[0].execute(ALL_REDUCE, timeout=60)
    waiting.join(timeout=30)
    for r in (mine, box["r"]):
        assert r.status == "ok" and "2.0" in r.text(), (r.error, r.text())
        assert "the process group was rebuilt before this cell" in r.text(), r.text()
    works(world)


@pytest.mark.timeout(120)
def test_a_barrier_and_a_collective_at_the_same_step_are_refused_on_both_naming_each(world):
    t0 = time.monotonic()
    results = kernels.execute_all(world, ["%dist_barrier --timeout 30", ALL_REDUCE.replace("60", "30")], timeout=60)
    assert time.monotonic() - t0 < 20  # refused, not waited out (--timeout 30)
    for r in results:
        assert r.status == "error" and r.error["ename"] == "CellMismatchError", r.error
        assert "the ranks reached different steps (rank 0: %dist_barrier #" in r.error["evalue"], r.error
        assert "rank 1: %%collective #" in r.error["evalue"], r.error
    works(world)


@pytest.mark.timeout(120)
def test_the_stop_button_at_a_start_barrier_is_one_line_and_clears_the_waiting_note(world, shared):
    round_ = round_of(world[0])
    thread, box = run_in_background(world[0], ALL_REDUCE, timeout=60)
    wait_for_note(shared, round_, 0, "waiting at %%collective", box)
    world[0].interrupt()
    thread.join(timeout=30)
    error = box["r"].error
    assert error["ename"] == "KeyboardInterrupt", error
    shown = "\n".join(error["traceback"])
    assert "stopped waiting at %%collective #" in shown and "the other ranks were told" in shown, shown
    assert "nbdist/" not in shown and "File " not in shown, shown  # no frames of nbdist's own
    note = note_of(shared, round_, 0)
    assert "barrier" not in note and note["what"].startswith("stopped waiting at %%collective #"), note
    # Rank 1 runs that cell later: it is told that step went by, and meets rank 0 at the next one.
    late, later = run_in_background(world[1], ALL_REDUCE, timeout=60)
    time.sleep(1)
    again = world[0].execute(ALL_REDUCE, timeout=60)
    late.join(timeout=30)
    assert again.status == "ok" and later["r"].status == "ok", (again.error, later["r"].error)
    assert "went by without this rank" in later["r"].text() and "interrupted its cell" in later["r"].text()


# A transformer that holds the cell before nbdist's own runs: a stop pressed then lands in the gap
# between ipykernel taking the request and IPython's pre_run_cell (nbdist.cell.prestart).
HOLD = ("import time as _t\n"
        "def _nbdist_test_hold(lines):\n"
        "    if lines and lines[0].startswith('%%collective') and globals().get('_hold_once'):\n"
        "        globals()['_hold_once'] = False\n"
        "        _t.sleep(1.5)\n"
        "    return lines\n"
        "get_ipython().input_transformers_cleanup.insert(0, _nbdist_test_hold)\n")
UNHOLD = "get_ipython().input_transformers_cleanup.remove(_nbdist_test_hold)\n"


@pytest.mark.timeout(120)
def test_the_stop_button_before_a_collective_starts_stops_it_and_the_others_are_told_at_once(world, shared):
    round_ = round_of(world[0])
    ok([world[1].execute(HOLD, timeout=30)])
    try:
        waiting, box = run_in_background(world[0], ALL_REDUCE, timeout=60)
        wait_for_note(shared, round_, 0, "waiting at %%collective", box)
        ok([world[1].execute("_hold_once = True", timeout=30)])
        stopped, mine = run_in_background(world[1], ALL_REDUCE, timeout=60)
        time.sleep(0.6)  # rank 1's cell is held in the transformer, before IPython's pre_run_cell
        world[1].interrupt()
        stopped.join(timeout=30)
        waiting.join(timeout=30)
        assert "r" in mine, f"rank 1's cell got no reply: {mine.get('exc')}"
        assert mine["r"].error["ename"] == "KeyboardInterrupt", mine["r"].error
        assert "pressed before this cell started" in "\n".join(mine["r"].error["traceback"])
        other = box["r"].error
        assert other["ename"] == "PeerFailedError" and "rank 1" in other["evalue"], other
        assert "interrupted its cell" in other["evalue"], other
        assert box["t"] - mine["t"] < 20  # told, not waiting out its --timeout 60
    finally:
        ok([world[1].execute(UNHOLD, timeout=30)])
    works(world)
