"""Cells that run for minutes, and plain cells: live tables, waits that know a working rank, stops.

Real kernels. Most tests share one two-rank world; the ones that kill a kernel form their own.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import BUSY, STOP_WITHIN, form, lend, ok, run_in_background

HOST = socket.gethostname()
PLAIN_ALL_REDUCE = "t = torch.ones(1); dist.all_reduce(t); t.item()"
ALL_REDUCE = "%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"


SESSION = "get_ipython().magics_manager.registry['DistMagics'].session"


def works(ks: list[kernels.Kernel]) -> None:
    """The next plain cell and the next %%collective work on every rank."""
    for r in ok(kernels.execute_all(ks, PLAIN_ALL_REDUCE, timeout=90)):
        assert r.text().strip().endswith(f"{float(len(ks))}"), r.text()
    for r in ok(kernels.execute_all(ks, ALL_REDUCE, timeout=90)):
        assert f"Out: {float(len(ks))}" in r.text()


def pid(kernel: kernels.Kernel) -> int:
    return int(kernel.execute("import os; os.getpid()").text().strip())


@pytest.fixture
def world(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, ALL_REDUCE)


@pytest.mark.timeout(120)
def test_a_six_second_cell_shows_every_notebook_its_table_growing_before_it_ends(world):
    code = "%%collective\nimport time\nfor i in range(6):\n    print(f'rank {RANK} step {i}')\n    time.sleep(1)\n"
    for r in ok(kernels.execute_all(world, code, timeout=60)):
        steps = r.updates()
        partial = [t for t in steps[:-1] if "state: running" in t and "step 5" not in t]
        assert len(partial) >= 3, steps
        assert any("rank 0 step 1" in t and "rank 1 step 1" in t for t in partial), partial
        final = r.text()
        assert "rank 0 step 5" in final and "rank 1 step 5" in final and "state:" not in final
        assert final.count("%%collective #") == 1  # the live table was replaced, not followed


@pytest.mark.timeout(60)
def test_a_short_cell_publishes_no_live_table(world):
    for r in ok(kernels.execute_all(world, "%%collective\nprint(RANK)\n", timeout=60)):
        assert r.updates() == [] and len(r.displays()) == 1


@pytest.mark.timeout(120)
def test_a_tqdm_loop_of_2000_steps_leaves_a_column_of_a_few_lines(world):
    ok(kernels.execute_all(world, "from tqdm.auto import tqdm as auto_tqdm\nfrom tqdm import tqdm", timeout=60))
    code = ("%%collective\nimport time\nfor i in tqdm(range(2000)):\n    time.sleep(0.0002)\n"
            "for i in auto_tqdm(range(500)):\n    pass\nprint('done')\n")
    for r in ok(kernels.execute_all(world, code, timeout=60)):
        text = r.text()
        assert "2000/2000" in text and "500/500" in text and "done" in text, text
        assert text.count("it/s") <= 4, text  # each bar once (per rank), not once per step
        assert len(text.splitlines()) < 25, text


@pytest.mark.timeout(120)
def test_a_rank_still_computing_is_waited_for_past_the_timeout(world):
    # 9 s: three times the --timeout 3, and longer than the 5 s without a heartbeat after which a rank counts as gone.
    code = "%%collective --timeout 3\nimport time\nif RANK == 0:\n    time.sleep(9)\nprint('done', RANK)\n"
    t0 = time.monotonic()
    results = ok(kernels.execute_all(world, code, timeout=60))
    assert time.monotonic() - t0 > 8  # rank 1 waited for rank 0's 9 s, past its --timeout 3
    assert all("done 0" in r.text() and "done 1" in r.text() for r in results)
    live = results[1].updates()
    assert any(re.search(r"state: running [5-9] s", t) and "finished in" in t for t in live), live


@pytest.mark.timeout(120)
def test_a_barrier_waits_past_its_timeout_for_a_rank_busy_in_a_cell_but_not_for_an_idle_one(world):
    busy, box = run_in_background(world[1], "import time; time.sleep(8)\n%dist_barrier", timeout=60)
    t0 = time.monotonic()
    r0 = world[0].execute("%dist_barrier --timeout 3", timeout=60)
    assert r0.status == "ok" and time.monotonic() - t0 > 7, (r0.error, time.monotonic() - t0)  # past --timeout 3
    busy.join(timeout=30)
    assert box["r"].status == "ok", box["r"].error
    t0 = time.monotonic()
    idle = world[0].execute("%dist_barrier --timeout 3", timeout=60)  # rank 1 runs nothing now
    assert idle.status == "error" and idle.error["ename"] == "WaitTimeout", idle.error
    assert world[1].execute("%dist_barrier --timeout 3", timeout=30).status == "error"  # closed: it fails at once


@pytest.mark.timeout(120)
def test_max_time_ends_a_long_body_on_every_rank_naming_who_was_running(world, record_fault):
    t0 = time.monotonic()
    results = kernels.execute_all(world, "%%collective --max-time 5\nimport time\ntime.sleep(30)\n", timeout=60)
    elapsed = time.monotonic() - t0
    record_fault("--max-time 5 on a 30 s body", elapsed)
    assert elapsed < 20, f"took {elapsed:.1f} s (the body sleeps 30 s)"
    for r in results:
        assert r.status == "error" and r.error["ename"] == "MaxTimeError", r.error
        assert re.search(r"rank \d \(.*\) was still running its body after --max-time 5 s", r.error["evalue"])
    works(world)


@pytest.mark.timeout(120)
def test_a_plain_cell_collective_that_the_peer_never_joins_ends_at_the_stop_button(world, record_fault):
    thread, box = run_in_background(world[0], PLAIN_ALL_REDUCE, timeout=60)
    time.sleep(2)
    pressed = time.monotonic()
    world[0].interrupt()
    thread.join(timeout=30)
    elapsed = box["t"] - pressed
    record_fault("stop button in a plain-cell collective", elapsed)
    assert elapsed < STOP_WITHIN + BUSY, f"took {elapsed:.1f} s"
    assert box["r"].status == "error" and box["r"].error["ename"] == "KeyboardInterrupt"
    works(world)


@pytest.mark.timeout(150)
def test_after_a_failed_collective_cell_plain_cells_get_a_working_group(world):
    failing = ("%%collective --timeout 60\nimport time\nif RANK == 1:\n    time.sleep(1)\n    1 / 0\n"
               "t = torch.ones(1)\ndist.all_reduce(t)\n")
    assert [r.status for r in kernels.execute_all(world, failing, timeout=60)] == ["error", "error"]
    thread, box = run_in_background(world[0], PLAIN_ALL_REDUCE, timeout=60)
    time.sleep(2)
    world[0].interrupt()
    thread.join(timeout=30)
    assert box["r"].status == "error" and box["r"].error["ename"] == "KeyboardInterrupt"
    works(world)


def world_round(world: list[kernels.Kernel]) -> int:
    """The world's round, read from rank 0 (while it is idle: a busy kernel answers after its cell)."""
    return world[0].execute("", user_expressions={"r": f"{SESSION}.world.round"}).expression("r")


def stop_from_a_terminal(round_: int, port: int) -> tuple[float, float]:
    """Run ``nbdist stop`` against the world at ``port`` in round ``round_``; return when it started and when its
    stop reached the store, seen from a third client (the command's own start, Python and its imports, is not
    the ranks')."""
    from nbdist.world.store import connect

    client = connect("127.0.0.1", port)
    try:
        before = client.add(f"r/{round_}/stops", 0)
        started = time.monotonic()
        command = subprocess.Popen([sys.executable, "-m", "nbdist.cli", "stop", "--master-addr", "127.0.0.1",
                                    "--master-port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        while client.add(f"r/{round_}/stops", 0) == before:
            assert command.poll() is None or time.monotonic() - started < 30, command.stdout.read()
            time.sleep(0.01)
        sent = time.monotonic()
    finally:
        client.close()
    out, _ = command.communicate(timeout=30)
    assert command.returncode == 0 and "stop #" in out, out
    return started, sent


@pytest.mark.timeout(150)
def test_nbdist_stop_in_a_terminal_ends_every_ranks_cell_within_2s(world, shared, record_fault):
    loop = "for i in range(10**6):\n    t = torch.ones(1); dist.all_reduce(t)\n"
    round_ = world_round(world)
    runs = [run_in_background(k, loop, timeout=60) for k in world]
    time.sleep(2)
    started, sent = stop_from_a_terminal(round_, shared.port)
    for thread, _ in runs:
        thread.join(timeout=30)
    elapsed = max(box["t"] for _, box in runs) - sent
    record_fault("nbdist stop during a loop of all_reduces", elapsed)
    record_fault("nbdist stop, with the command's own start", max(box["t"] for _, box in runs) - started)
    assert elapsed < STOP_WITHIN + BUSY, f"took {elapsed:.1f} s from the stop reaching the store"
    for _, box in runs:
        r = box["r"]
        assert r.status == "error" and r.error["ename"] == "StoppedError", r.error
        assert f"stopped by nbdist stop in a terminal on {HOST}" in r.error["evalue"]
    works(world)


@pytest.mark.timeout(150)
def test_a_stop_in_a_collective_cell_ends_it_on_every_rank_and_the_next_cell_works(world, shared):
    body = "%%collective\nimport time\nfor i in range(300):\n    time.sleep(0.1)\n"
    round_ = world_round(world)
    runs = [run_in_background(k, body, timeout=60) for k in world]
    time.sleep(2)
    _, sent = stop_from_a_terminal(round_, shared.port)
    for thread, _ in runs:
        thread.join(timeout=30)
    elapsed = max(box["t"] for _, box in runs) - sent
    assert elapsed < STOP_WITHIN + BUSY, f"took {elapsed:.1f} s from the stop reaching the store"
    for _, box in runs:
        assert box["r"].status == "error" and box["r"].error["ename"] == "StoppedError", box["r"].error
        assert "stopped by nbdist stop" in box["r"].text()  # in the table as well
    works(world)


@pytest.mark.timeout(240)
def test_dist_stop_in_another_joined_notebook_ends_the_others_cells(start_kernels, port, record_fault):
    ks = start_kernels(3)
    form(ks, port)
    ok(kernels.execute_all(ks, "%%collective\npair = dist.new_group([0, 1])\n", timeout=60))
    loop = "for i in range(10**6):\n    t = torch.ones(1); dist.all_reduce(t, group=pair)\n"
    runs = [run_in_background(k, loop, timeout=60) for k in ks[:2]]
    time.sleep(2)
    sent = time.monotonic()
    r = ks[2].execute("%dist_stop", timeout=30)
    assert r.status == "ok" and "stop #1 sent" in r.text(), r.error
    for thread, _ in runs:
        thread.join(timeout=30)
    elapsed = max(box["t"] for _, box in runs) - sent
    record_fault("%dist_stop from another notebook", elapsed)
    assert elapsed < STOP_WITHIN + BUSY, f"took {elapsed:.1f} s"
    rank2 = f"rank 2 ({HOST}, pid {pid(ks[2])}) with %dist_stop"
    for _, box in runs:
        assert box["r"].status == "error" and box["r"].error["ename"] == "StoppedError", box["r"].error
        assert f"stopped by {rank2}" in box["r"].error["evalue"]
    works(ks)


@pytest.mark.timeout(240)
def test_a_working_rank_whose_kernel_dies_is_named_within_10s(start_kernels, port, record_fault):
    ks = start_kernels(2)  # new kernels, not the reused ones: one is killed
    form(ks, port)
    pid1 = pid(ks[1])  # rank 1 works alone; rank 0 (which hosts the server) waits for it past --timeout
    code = "%%collective --timeout 3\nimport time\nif RANK == 1:\n    time.sleep(15)\n"
    t0, box0 = run_in_background(ks[0], code, timeout=60)
    t1, box1 = run_in_background(ks[1], code, timeout=8)  # killed: it never replies
    time.sleep(5)
    killed = time.monotonic()
    os.kill(pid1, signal.SIGKILL)
    t0.join(timeout=30)
    elapsed = box0["t"] - killed
    record_fault("a rank at work is killed", elapsed)
    assert elapsed < 10, f"took {elapsed:.1f} s"
    r0 = box0["r"]
    assert r0.status == "error" and r0.error["ename"] == "PeerLostError", r0.error
    assert f"rank 1 ({HOST}, pid {pid1}) is gone" in r0.error["evalue"]
    t1.join(timeout=30)


@pytest.mark.timeout(240)
def test_a_plain_cell_collective_names_a_peer_whose_kernel_is_killed_within_10s(start_kernels, port, record_fault):
    ks = start_kernels(2)  # new kernels, not the reused ones: one is killed
    form(ks, port)
    pid1 = pid(ks[1])
    t0, box0 = run_in_background(ks[0], PLAIN_ALL_REDUCE, timeout=60)
    time.sleep(2)
    killed = time.monotonic()
    os.kill(pid1, signal.SIGKILL)
    t0.join(timeout=30)
    elapsed = box0["t"] - killed
    record_fault("plain-cell collective, peer killed", elapsed)
    assert elapsed < 10, f"took {elapsed:.1f} s"
    r0 = box0["r"]
    assert r0.status == "error" and r0.error["ename"] == "PeerLostError", r0.error
    assert f"rank 1 ({HOST}, pid {pid1}) is gone" in r0.error["evalue"]
