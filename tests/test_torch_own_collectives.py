"""Collectives that torch's own code starts from C++ (DDP's constructor): refused, stoppable, rebuilt after.

Real kernels, real TCP on loopback (issue 35). A driving notebook refuses them in a plain cell as it
refuses a plain ``dist.send``; in a peer world the stop button ends one that the other rank never joins,
and the next cells work on every rank.
"""

from __future__ import annotations

import time

import pytest

from nbdist.drive import kernels

from .conftest import BUSY, STOP_WITHIN, form, free_port, lend, ok, run_in_background

PLAIN_ALL_REDUCE = "t = torch.ones(1); dist.all_reduce(t); t.item()"
ALL_REDUCE = "%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())\n"
FUNCTIONAL = ("import torch.distributed._functional_collectives as funcol\n"
              "funcol.all_reduce(torch.ones(1), 'sum', dist.group.WORLD).item()\n")
DDP = ("model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
       "print('built', sum(p.numel() for p in model.parameters()))\n")


@pytest.mark.timeout(240)
def test_a_ddp_model_built_in_a_plain_cell_of_a_driving_notebook_is_refused_at_once(driver, record_fault):
    r = driver.execute(f"%dist_init --spawn 2 --master-port {free_port()} --pg-timeout 60", timeout=180)
    assert r.status == "ok", r.error
    t0 = time.monotonic()
    refused = driver.execute(DDP, timeout=60)
    took = time.monotonic() - t0
    assert refused.status == "error" and refused.error["ename"] == "DriveError", refused.error
    assert "%%collective" in refused.error["evalue"], refused.error
    assert took < 5, f"took {took:.1f} s"
    sent = driver.execute("dist.send(torch.ones(1), dst=1)", timeout=30)  # the same refusal as a plain send
    assert sent.status == "error" and sent.error["evalue"] == refused.error["evalue"], sent.error
    # The world is intact: the same model in a %%collective is built on every rank.
    text = ok([driver.execute("%%collective\n" + DDP, timeout=120)])[0].text()
    assert "all 2 ranks (identical)" in text and "built 10" in text, text
    # DDP's backward starts its all_reduce from C++, which nothing wraps: torch's count of the group's
    # collectives moves, and the watcher cuts it and refuses it the same way.
    t0 = time.monotonic()
    backward = driver.execute("model(torch.ones(3, 4)).sum().backward()", timeout=60)
    took = time.monotonic() - t0
    record_fault("DDP backward in a plain cell of a driving notebook", took)
    assert backward.status == "error" and backward.error["ename"] == "DriveError", backward.error
    assert backward.error["evalue"] == refused.error["evalue"], backward.error
    assert took < 5, f"took {took:.1f} s"
    again = ok([driver.execute(ALL_REDUCE, timeout=120)])[0].text()  # the group is rebuilt on every rank
    assert "all 2 ranks (identical)" in again and "2.0" in again, again
    functional = driver.execute(FUNCTIONAL, timeout=60)  # a functional collective: a C++ op, nothing wraps it
    assert functional.status == "error" and functional.error["ename"] == "DriveError", functional.error
    again = ok([driver.execute(ALL_REDUCE, timeout=120)])[0].text()
    assert "all 2 ranks (identical)" in again and "2.0" in again, again



@pytest.fixture
def world(shared):
    yield from lend(shared, ALL_REDUCE)


def stop_during(kernel: kernels.Kernel, code: str, after: float = 3.0) -> tuple[kernels.Result, float]:
    """Run ``code``, press the stop button ``after`` seconds in; the result and the seconds from the press to
    the cell's end."""
    thread, box = run_in_background(kernel, code, timeout=90)
    time.sleep(after)
    assert thread.is_alive(), box
    pressed = time.monotonic()
    kernel.interrupt()
    thread.join(timeout=60)
    assert "r" in box, box
    return box["r"], box["t"] - pressed


@pytest.mark.timeout(240)
def test_a_ddp_model_built_in_a_plain_cell_of_one_peer_only_ends_at_the_stop_button_and_the_next_cells_work(
        world, record_fault):
    stopped, took = stop_during(world[0], DDP)
    record_fault("stop button in DDP's constructor in a plain cell", took)
    assert took < STOP_WITHIN + BUSY, f"took {took:.1f} s"
    assert stopped.status == "error" and stopped.error["ename"] == "KeyboardInterrupt", stopped.error
    for r in ok(kernels.execute_all(world, PLAIN_ALL_REDUCE, timeout=90)):
        assert r.text().strip().endswith("2.0"), r.text()
    for r in ok(kernels.execute_all(world, DDP, timeout=90)):
        assert "built 10" in r.text(), r.text()


@pytest.mark.timeout(240)
def test_ddp_backward_in_a_plain_cell_of_one_peer_only_ends_at_the_stop_button_and_the_next_cells_work(
        world, record_fault):
    ok(kernels.execute_all(world, DDP, timeout=90))  # both ranks hold the model
    stopped, took = stop_during(world[0], "model(torch.ones(3, 4)).sum().backward()", after=2.0)
    record_fault("stop button in DDP's backward in a plain cell", took)
    assert took < STOP_WITHIN + BUSY, f"took {took:.1f} s"
    assert stopped.status == "error" and stopped.error["ename"] == "KeyboardInterrupt", stopped.error
    for r in ok(kernels.execute_all(world, PLAIN_ALL_REDUCE, timeout=90)):
        assert r.text().strip().endswith("2.0"), r.text()
    for r in ok(kernels.execute_all(world, DDP + "model(torch.ones(3, 4)).sum().backward()\n", timeout=90)):
        assert "built 10" in r.text(), r.text()


@pytest.mark.timeout(240)
def test_a_ddp_backward_that_one_rank_skips_in_a_collective_cell_is_named_a_mismatch_at_once(world, record_fault):
    ok(kernels.execute_all(world, "%%collective\n" + DDP, timeout=90))
    skipped = "%%collective --timeout 8\nloss = model(torch.ones(3, 4)).sum()\nif RANK == 0:\n    loss.backward()\n"
    t0 = time.monotonic()
    results = kernels.execute_all(world, skipped, timeout=90)
    took = time.monotonic() - t0
    record_fault("DDP backward skipped on one rank of a %%collective", took)
    assert took < 8, f"took {took:.1f} s"
    for r in results:
        assert r.status == "error" and r.error["ename"] == "CollectiveMismatchError", r.error
        assert "rank 1" in r.error["evalue"] and "the ranks run different collectives" in r.error["evalue"], r.error
    for r in ok(kernels.execute_all(world, ALL_REDUCE, timeout=90)):  # the group is rebuilt
        assert "2.0" in r.text(), r.text()


@pytest.mark.timeout(240)
def test_after_a_stopped_plain_all_reduce_a_ddp_cell_rebuilds_the_group_and_says_so_in_one_line(world):
    stopped, took = stop_during(world[0], PLAIN_ALL_REDUCE, after=1.0)
    assert took < STOP_WITHIN + BUSY and stopped.status == "error", (took, stopped.error)
    first = kernels.execute_all(world, DDP, timeout=90)
    for r in first:  # DDP took the group the stop broke; the rebuild replaced it: run again, one line says
        assert r.status == "error" and r.error["ename"] == "StaleGroupError", r.error
        assert "Run the cell again" in r.error["evalue"] and "gloo" not in str(r.error), r.error
        assert len(r.error["traceback"]) <= 1, r.error["traceback"]
    for r in ok(kernels.execute_all(world, DDP, timeout=90)):
        assert "built 10" in r.text(), r.text()


@pytest.mark.timeout(240)
def test_after_ddp_backward_timed_out_on_one_rank_the_next_plain_collective_rebuilds_the_group(reused_kernels, port):
    ks = reused_kernels(2)
    form(ks, port, "--pg-timeout 4")
    ok(kernels.execute_all(ks, DDP, timeout=90))
    alone = ks[0].execute("model(torch.ones(3, 4)).sum().backward()", timeout=60)
    assert alone.status == "error", alone.error  # gloo's own timeout: torch says so
    for r in ok(kernels.execute_all(ks, PLAIN_ALL_REDUCE, timeout=90)):
        assert r.text().strip().endswith("2.0"), r.text()


@pytest.mark.timeout(240)
def test_a_functional_collective_in_a_plain_cell_of_one_peer_only_ends_at_the_stop_button(world, record_fault):
    stopped, took = stop_during(world[0], FUNCTIONAL, after=2.0)
    record_fault("stop button in a functional collective in a plain cell", took)
    assert took < STOP_WITHIN + BUSY, f"took {took:.1f} s"
    assert stopped.status == "error" and stopped.error["ename"] == "KeyboardInterrupt", stopped.error
    for r in ok(kernels.execute_all(world, PLAIN_ALL_REDUCE, timeout=90)):
        assert r.text().strip().endswith("2.0"), r.text()
