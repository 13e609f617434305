"""A world of notebooks: forming it, running collectives, seeing every rank's output."""

from __future__ import annotations

import ast
import socket
import time

import pytest

from nbdist.demo import STEPS, expectations, plain_torch_checksum
from nbdist.drive import kernels

from .conftest import init_line, run_in_background

ALL_REDUCE = """%%collective
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {RANK} sum {t.item()}")
t.item()
"""


def _walkthrough(ks: list[kernels.Kernel]) -> None:
    n = len(ks)
    expected = expectations(n)
    for name, code, key in STEPS:
        results = kernels.execute_all(ks, "%%collective\n" + code, timeout=120, user_expressions={"v": "_nbdist_demo"})
        if key == "ddp":  # [epochs, weight checksum, identical]: DDP keeps every rank's weights equal, bit for bit
            values = [ast.literal_eval(r.expression("v")) for r in results if r.status == "ok"]
            assert all(v[2] for v in values), f"{name}: the ranks' weights differ (torch.equal): {values}"
            if n == 2:  # plain torch's own run (2 ranks; the 4-rank one would only repeat it, slower)
                assert {v[1] for v in values} == {plain_torch_checksum(n)}, f"{name}: not plain torch's: {values}"
        for rank, r in enumerate(results):
            assert r.status == "ok", f"{name} failed on rank {rank}: {r.error}"
            value = ast.literal_eval(r.expression("v"))
            if key == "ddp":
                assert value[0] == 5, f"{name}: rank {rank} ran {value[0]} epochs"
            else:
                assert value == expected[key], f"{name}: rank {rank} got {value}"
            # Every notebook shows every rank's column, in rank order.
            text = r.text()
            positions = [text.find(f"── rank {i} ") for i in range(n)]
            assert all(p >= 0 for p in positions), f"{name}: rank {rank}'s notebook lacks a column:\n{text}"
            assert positions == sorted(positions)
            html = r.displays()
            assert html and all(f"rank {i} · " in html[-1] for i in range(n))


@pytest.mark.timeout(240)
def test_two_notebooks_run_the_walkthrough_and_each_shows_both_ranks(make_world):
    _walkthrough(make_world(2))


@pytest.mark.timeout(300)
def test_four_notebooks_run_the_walkthrough(make_world):
    _walkthrough(make_world(4))


@pytest.mark.timeout(120)
def test_every_notebook_shows_every_ranks_output_side_by_side(make_world):
    ks = make_world(2)
    results = kernels.execute_all(ks, ALL_REDUCE, timeout=60)
    for r in results:
        assert r.status == "ok", r.error
        text = r.text()
        assert "rank 0 sum 1.0" in text and "rank 1 sum 1.0" in text
        html = r.displays()[-1]
        assert "rank 0 sum 1.0" in html and "rank 1 sum 1.0" in html
        assert "differs between ranks" in html  # stdout differs (rank numbers)
        assert "identical on all 2 ranks" in html  # Out is 1.0 on both


@pytest.mark.timeout(180)
def test_ranks_arriving_twenty_seconds_apart_form_a_world(reused_kernels, port):
    """The quick start: "Ranks may arrive in any order and minutes apart; while waiting, the cell shows a status
    updated in place (who joined from where, who is missing, elapsed time ...)". Here rank 1 comes first."""
    import re
    import socket

    from .conftest import run_timed_in_background

    ks = reused_kernels(2)
    # Rank 1 first: it must wait for rank 0's server. Each of its outputs carries its arrival time.
    first, box = run_timed_in_background(ks[1], init_line(1, 2, port))
    started = time.monotonic()
    time.sleep(20)
    rank0_started = time.monotonic()
    r0 = ks[0].execute(init_line(0, 2, port), timeout=120)
    first.join(timeout=120)
    assert not first.is_alive(), "rank 1's %%dist_init never finished"
    assert r0.status == "ok", r0.error
    r1 = box["r"]
    assert r1.status == "ok", r1.error
    assert box["t"] > rank0_started, "rank 1's %%dist_init ended before rank 0's began"
    # While waiting, rank 1 showed a live status, updated in place (not a growing log) the whole time.
    shown = [o for o in r1.outputs if o["msg_type"] == "display_data"]
    updates = [o for o in r1.outputs if o["msg_type"] == "update_display_data"]
    assert shown and updates, "rank 1 showed no live status while waiting"
    display_id = shown[0]["content"]["transient"]["display_id"]
    assert all(u["content"]["transient"]["display_id"] == display_id for u in updates)
    waiting = [u for u in updates if u["t"] < rank0_started]
    for u in waiting:
        text = u["content"]["data"]["text/plain"]
        assert f"waiting for the rendezvous server at 127.0.0.1:{port}: refused (rank 0 starts it" in text
    assert waiting and waiting[0]["t"] - started < 10, "rank 1 said nothing of the missing server for 10 s"
    texts = [u["content"]["data"]["text/plain"] for u in waiting]
    assert any("missing: 0" in t and re.search(r"\b[1-9]\d* s elapsed", t) for t in texts), texts
    times = [*(u["t"] for u in waiting), rank0_started]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) < 5, f"the live status stood still for {max(gaps):.1f} s while rank 1 waited"
    # Once rank 0 came, the same display said the world formed, with both ranks and their host.
    final = updates[-1]
    assert final["t"] > rank0_started
    host = socket.gethostname()
    assert final["content"]["data"]["text/plain"].splitlines()[1:] == [f"joined: 0 ({host}), 1 ({host})",
                                                                       "missing: none"]
    assert "world formed" in final["content"]["data"]["text/plain"]
    elapsed = int(final["content"]["data"]["text/plain"].split(" s elapsed")[0].rsplit(" ", 1)[1])
    assert elapsed >= 19, "the elapsed time shown does not count rank 1's wait for the server"
    results = kernels.execute_all(ks, ALL_REDUCE, timeout=60)
    assert all(r.status == "ok" for r in results)


@pytest.mark.timeout(120)
def test_an_exception_on_one_rank_fails_the_cell_on_every_rank(make_world):
    ks = make_world(2)
    code = "%%collective\nprint('before', RANK)\nif RANK == 1:\n    1 / 0\n'done'\n"
    r0, r1 = kernels.execute_all(ks, code, timeout=60)
    assert r1.status == "error" and r1.error["ename"] == "CollectiveError"
    assert "ZeroDivisionError" in r1.error["evalue"]
    assert r0.status == "error" and r0.error["ename"] == "CollectiveError"
    assert "rank 1" in r0.error["evalue"] and "ZeroDivisionError" in r0.error["evalue"]
    for r in (r0, r1):
        text = r.text()
        assert "before 0" in text and "before 1" in text  # what the ranks printed is still shown
        assert "1 / 0" in text  # rank 1's traceback, in every notebook
    # The world carries on.
    assert all(r.status == "ok" for r in kernels.execute_all(ks, ALL_REDUCE, timeout=60))


@pytest.mark.timeout(120)
def test_a_duplicate_rank_is_refused_naming_the_other_host(make_world, start_kernels, port, record_fault):
    ks = make_world(2)
    pid1 = ks[1].execute("import os; os.getpid()").text().strip()
    (late,) = start_kernels(1)
    t0 = time.monotonic()
    r = late.execute(init_line(1, 2, port, "--timeout 20"), timeout=60)
    record_fault("two notebooks claim the same rank", time.monotonic() - t0)
    assert time.monotonic() - t0 < 15  # not at --timeout 20 (measured: about 2.5 s, to see the holder's heartbeat move)
    assert r.status == "error" and r.error["ename"] == "JoinError"
    assert f"rank 1 is already taken by a notebook on {socket.gethostname()} (pid {pid1})" in r.error["evalue"]


@pytest.mark.timeout(120)
def test_world_sizes_that_disagree_fail_on_every_rank(reused_kernels, port):
    ks = reused_kernels(2)
    t, box = run_in_background(ks[0], init_line(0, 2, port), timeout=60)
    time.sleep(3)
    r1 = ks[1].execute(init_line(1, 3, port), timeout=60)
    t.join(timeout=60)
    assert r1.status == "error" and "world sizes disagree" in r1.error["evalue"]
    assert box["r"].status == "error" and "world sizes disagree" in box["r"].error["evalue"]
    # Fixed flags then form the world.
    results = kernels.execute_all(ks, [init_line(i, 2, port) for i in range(2)], timeout=60)
    assert all(r.status == "ok" for r in results), [r.error for r in results]


@pytest.mark.timeout(180)
def test_rerunning_dist_init_rejoins_and_the_others_are_told(make_world, port):
    ks = make_world(2)
    t, r0 = run_in_background(ks[0], init_line(0, 2, port), timeout=60)
    time.sleep(2)
    # Rank 1 has not re-run its init: its next collective is told to.
    stale = ks[1].execute("%%collective --timeout 30\nx = 1\n", timeout=60)
    assert stale.status == "error" and stale.error["ename"] == "WorldChangedError"
    assert "re-run %%dist_init" in stale.error["evalue"]
    assert "rank 0 (" in stale.error["evalue"] and "left this world" in stale.error["evalue"], stale.error["evalue"]
    r1 = ks[1].execute(init_line(1, 2, port), timeout=60)
    t.join(timeout=60)
    assert r0["r"].status == "ok" and r1.status == "ok", (r0["r"].error, r1.error)
    assert all(r.status == "ok" for r in kernels.execute_all(ks, ALL_REDUCE, timeout=60))


@pytest.mark.timeout(120)
def test_status_barrier_and_destroy(make_world):
    ks = make_world(2)
    r = ks[0].execute("%dist_status", timeout=30)
    assert r.status == "ok", r.error
    text = r.text()
    assert "rank 0" in text and "rank 1" in text and "yes (heartbeat" in text
    results = kernels.execute_all(ks, "%dist_barrier --timeout 30", timeout=60)
    assert all(x.status == "ok" and "all 2 ranks met" in x.text() for x in results)
    r = ks[1].execute("%dist_destroy", timeout=30)
    assert r.status == "ok" and "left the world" in r.text()
    r = ks[0].execute("%dist_status", timeout=30)
    assert "left" in r.text()
    r = ks[1].execute("%%collective\nx = 1\n", timeout=30)
    assert r.status == "error" and r.error["ename"] == "NotInitializedError"
    # Rank 0's next collective learns that rank 1 left, instead of waiting out its timeout.
    t0 = time.monotonic()
    r = ks[0].execute("%%collective --timeout 60\nx = 1\n", timeout=90)
    assert r.status == "error" and r.error["ename"] == "WorldChangedError"
    assert "rank 1" in r.error["evalue"] and "left the world" in r.error["evalue"]
    assert time.monotonic() - t0 < 30  # not at --timeout 60


@pytest.mark.timeout(120)
def test_a_barrier_that_runs_out_names_the_missing_rank_and_what_it_last_did(make_world):
    ks = make_world(2)
    r = ks[0].execute("%%collective --timeout 3\nx = 1\n", timeout=60)
    assert r.status == "error" and r.error["ename"] == "WaitTimeout"
    message = r.error["evalue"]
    assert "Missing: rank 1" in message and "last: joined" in message
    # Rank 1, arriving late, is told at once that that step went by without it, and meets rank 0 at the next.
    thread, box = run_in_background(ks[1], "%%collective --timeout 30\nx = 1\n", timeout=60)
    time.sleep(1.0)
    assert "r" not in box, box["r"].error
    mine = ks[0].execute("%%collective --timeout 30\nx = 1\n", timeout=60)
    thread.join(timeout=30)
    assert mine.status == "ok" and box["r"].status == "ok", (mine.error, box["r"].error)
    assert ("nbdist: step #1 went by without this rank (the last: rank 0 (" in box["r"].text()
            and "gave up waiting after 3 s); it meets the others at step #2" in box["r"].text()), box["r"].text()
    assert "went by" not in mine.text()
    # The next cell works on both.
    assert all(x.status == "ok" for x in kernels.execute_all(ks, ALL_REDUCE, timeout=60))


@pytest.mark.timeout(120)
def test_the_stop_button_ends_a_join_and_the_slot_is_given_back(reused_kernels, port):
    ks = reused_kernels(2)
    t, box = run_in_background(ks[0], init_line(0, 2, port), timeout=60)
    time.sleep(5)  # rank 0 is waiting for rank 1
    stopped = time.monotonic()
    ks[0].interrupt()
    t.join(timeout=30)
    assert not t.is_alive()
    assert time.monotonic() - stopped < 2, "the join did not stop within 2 s"
    assert box["r"].status == "error" and box["r"].error["ename"] == "KeyboardInterrupt"
    # The interrupted rank 0 does not count as joined: rank 1 keeps waiting for it...
    r1 = ks[1].execute(init_line(1, 2, port, "--timeout 4"), timeout=60)
    assert r1.status == "error" and r1.error["ename"] == "WaitTimeout"
    assert "missing rank 0" in r1.error["evalue"]
    # ...until both run it again.
    results = kernels.execute_all(ks, [init_line(i, 2, port) for i in range(2)], timeout=60)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
