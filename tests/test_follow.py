"""One notebook drives, the others follow (%dist_follow): real kernels, real TCP on loopback.

The attacks write into the store with the test's own TCPStore client, as
anyone who can reach the port could.
"""

from __future__ import annotations

import ast
import json
import os
import time
from datetime import timedelta

import pytest

from nbdist import demo
from nbdist.drive import kernels

from .conftest import ok, run_in_background

SLOW = "%%collective\nimport time\nfor _ in range(600):\n    time.sleep(0.05)\n"  # 30 s; a stop ends it at once
DRIVEN = "%%collective\nt = torch.tensor([float(RANK + 1)])\ndist.all_reduce(t)\nprint('sum', t.item())\n"


def raw_store(port: int):
    """A plain TCPStore client of the world's server (nbdist's keys live under ``nbdist/``)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))


def round_of(store) -> int:
    text = store.get("nbdist/round").decode() if store.check(["nbdist/round"]) else ""
    return int(text) if text else 0  # as nbdist.world.counters.current_round reads it


def wait_following(port: int, ranks: list[int], timeout: float = 30) -> None:
    """Until each of ``ranks`` follows (its ``follow/<rank>`` key holds its session)."""
    store = raw_store(port)
    deadline = time.monotonic() + timeout
    r = round_of(store)
    while True:
        keys = [f"nbdist/r/{r}/follow/{i}" for i in ranks]
        if all(store.check([k]) and store.get(k) for k in keys):
            return
        assert time.monotonic() < deadline, f"ranks {ranks} did not start following within {timeout} s"
        time.sleep(0.1)


def follow_in(kernel: kernels.Kernel, port: int, rank: int, timeout: float = 300):
    thread, box = run_in_background(kernel, "%dist_follow", timeout=timeout)
    wait_following(port, [rank])
    return thread, box


def ended(thread, box, within: float = 30) -> kernels.Result:
    thread.join(within)
    assert not thread.is_alive(), f"%dist_follow did not end within {within} s"
    assert "r" in box, box
    return box["r"]


@pytest.fixture
def pair(make_world, port):
    """Two ranks on one machine, no token (the server's key signs the cells)."""
    ks = make_world(2)
    return ks, port


def test_the_walkthrough_driven_from_rank_0_runs_on_its_follower_and_release_returns_it_to_lockstep(pair):
    (a, b), port = pair
    thread, box = follow_in(b, port, 1)
    for step, code, _key in demo.STEPS:
        r = a.execute("%%collective\n" + code, timeout=180)
        assert r.status == "ok", f"{step}: {r.error}"
    released = a.execute("%dist_release", timeout=30)
    assert "released the world" in released.text()
    result = ended(thread, box)
    assert result.status == "ok", result.error
    text = result.text()
    assert "rank 1 follows" in text and "released the world (%dist_release)" in text, text
    # The follower showed each cell's source and the side-by-side table, as the driver did.
    assert "runs %%collective #1:" in text and "dist.all_reduce(tensor, op=dist.ReduceOp.SUM)" in text, text
    assert "%%collective #4 · 2 ranks" in text, text
    assert "[Rank 1] AllReduce result: 1.0" in text and "[Rank 0] AllReduce result: 1.0" in text, text
    want = demo.expectations(2)
    for k in (a, b):
        assert ast.literal_eval(k.execute("1", user_expressions={"v": "tensor.item()"}).expression("v")) == \
            want["allreduce"]
        assert ast.literal_eval(k.execute("1", user_expressions={"v": "result"}).expression("v")) == want["allgather"]
    checksums = {k.execute("1", user_expressions={"v": "_nbdist_demo"}).expression("v") for k in (a, b)}
    assert len(checksums) == 1, checksums  # DDP: the same weights on both ranks
    # Back in lockstep: each notebook runs its own cell again.
    results = ok(kernels.execute_all([a, b], DRIVEN, timeout=60))
    assert all("sum 3.0" in r.text() for r in results)


def test_a_follower_ends_when_the_driver_leaves_and_a_driver_cell_error_keeps_it_following(pair):
    (a, b), port = pair
    thread, box = follow_in(b, port, 1)
    failed = a.execute("%%collective\nraise ValueError('boom on every rank')", timeout=60)
    assert failed.status == "error" and "boom on every rank" in str(failed.error)
    r = a.execute(DRIVEN, timeout=60)
    assert r.status == "ok", r.error  # the follower went on after the failed cell
    plain = a.execute("t = torch.ones(1)\ndist.all_reduce(t)", timeout=30)  # its follower would never join it
    assert plain.status == "error" and plain.error["ename"] == "DriveError", plain.error
    assert "%%collective" in plain.error["evalue"], plain.error
    assert a.execute("%dist_destroy", timeout=60).status == "ok"
    result = ended(thread, box)
    text = result.text()
    assert "ValueError" in text and "boom on every rank" in text, text
    assert "sum 3.0" in text, text
    assert "rank 0" in text and "left the world (%dist_destroy" in text, text


def test_the_stop_button_in_the_driver_ends_every_ranks_cell_and_the_follower_follows_on(pair):
    (a, b), port = pair
    thread, box = follow_in(b, port, 1)
    slow, sbox = run_in_background(a, SLOW, timeout=90)
    time.sleep(2.0)
    started = time.monotonic()
    a.interrupt()
    slow.join(30)
    assert not slow.is_alive()
    assert sbox["r"].status == "error" and sbox["r"].error["ename"] == "KeyboardInterrupt", sbox["r"].error
    assert time.monotonic() - started < 10
    r = a.execute(DRIVEN, timeout=60)
    assert r.status == "ok", r.error
    a.execute("%dist_release", timeout=30)
    text = ended(thread, box).text()
    assert "rank 0" in text and "interrupted its cell" in text, text
    assert "sum 3.0" in text, text


def test_the_stop_button_in_a_follower_mid_cell_leaves_follow_mode_and_keeps_it_in_the_world(pair):
    (a, b), port = pair
    thread, box = follow_in(b, port, 1)
    # 5 s: the driver's body computes, so another rank's stop leaves it alone (nbdist.cell.watch) and it ends then.
    slow, sbox = run_in_background(a, SLOW.replace("range(600)", "range(100)"), timeout=90)
    time.sleep(2.0)
    b.interrupt()
    slow.join(30)
    assert sbox["r"].status == "error" and "rank 1" in str(sbox["r"].error) and "interrupted" in str(
        sbox["r"].error), sbox["r"].error
    result = ended(thread, box)
    assert result.status == "ok", result.error
    assert "stopped following (the stop button)" in result.text() and "stays in the world as rank 1" in result.text()
    # Why it stopped following is in its note, for a notebook that does not see its output (a spawned worker's).
    status = a.execute("%dist_status", timeout=30).text()
    assert "stopped following: KeyboardInterrupt" in status, status
    # In the world still, and in lockstep: both notebooks run their own cell.
    results = ok(kernels.execute_all([a, b], DRIVEN, timeout=60))
    assert all("sum 3.0" in r.text() for r in results)


def test_a_second_notebook_that_tries_to_drive_is_told_who_drives(start_kernels, port):
    from .conftest import form

    ks = start_kernels(3)
    form(ks, port)
    a, b, c = ks
    tb, bb = run_in_background(b, "%dist_follow", timeout=300)
    tc, bc = run_in_background(c, "%dist_follow", timeout=300)
    wait_following(port, [1, 2])
    assert a.execute(DRIVEN, timeout=60).status == "ok"
    c.interrupt()  # the stop button while it waits for the next cell
    r = ended(tc, bc)
    assert r.status == "ok" and "stopped following" in r.text(), r.text()
    refused = c.execute(DRIVEN, timeout=60)
    assert refused.status == "error" and refused.error["ename"] == "DriveError", refused.error
    assert "rank 0" in refused.error["evalue"] and "drives this world" in refused.error["evalue"], refused.error
    assert "ranks following it: 1" in refused.error["evalue"], refused.error
    # It follows again; the driver's next cell runs on all three.
    tc, bc = run_in_background(c, "%dist_follow", timeout=300)
    wait_following(port, [2])
    r = a.execute(DRIVEN.replace("print('sum'", "print('again'"), timeout=60)
    assert r.status == "ok", r.error
    assert r.text().count("again 6.0") >= 1 and "3 ranks" in r.text(), r.text()
    a.execute("%dist_release", timeout=30)
    for t, bx in ((tb, bb), (tc, bc)):
        assert "again 6.0" in ended(t, bx).text()


# --- attacks: each written straight into the store ------------------------------------------------

def _marker_cell(path: str) -> str:
    return f"%%collective\nopen({path!r} + '.' + str(RANK), 'a').write('x')\n"


def _refused(thread, box) -> str:
    result = ended(thread, box)
    assert result.status == "error" and result.error["ename"] == "SigningError", result.error
    return result.error["evalue"]


def test_forged_replayed_and_earlier_round_cells_are_refused_and_do_not_run(pair, tmp_path):
    (a, b), port = pair
    path = str(tmp_path / "ran")
    store = raw_store(port)

    # A genuine cell first: it appends one "x" on each rank.
    thread, box = follow_in(b, port, 1)
    assert a.execute(_marker_cell(path), timeout=60).status == "ok"
    assert open(path + ".1").read() == "x"
    r0 = round_of(store)
    genuine = json.loads(store.get(f"nbdist/r/{r0}/drive/1"))
    assert genuine["kind"] == "collective" and genuine["sig"]

    # 1. Forged: the right layout, someone else's code, the old signature.
    forged = {**genuine, "seq": 2, "source": f"open({path!r} + '.forged', 'w').write('pwned')"}
    store.set(f"nbdist/r/{r0}/drive/2", json.dumps(forged))
    why = _refused(thread, box)
    assert "signature does not verify" in why and "Nothing of it ran" in why, why
    assert not os.path.exists(path + ".forged")
    told = a.execute(DRIVEN, timeout=60)  # the driver hears of it at its next cell
    assert told.status == "error" and told.error["ename"] == "DriveError", told.error
    assert "rank 1" in told.error["evalue"] and "refused" in told.error["evalue"], told.error

    # 2. Replayed: the genuine cell, signed and all, put where the next one is due.
    thread, box = follow_in(b, port, 1)
    seq = store.add(f"nbdist/r/{r0}/drive/seq", 0) + 1
    store.set(f"nbdist/r/{r0}/drive/{seq}", json.dumps(genuine))
    why = _refused(thread, box)
    assert "a replay" in why and f"where {seq} was due" in why, why
    assert open(path + ".1").read() == "x"  # not run a second time

    # 3. From an earlier round: both notebooks join again (round r0 + 1, the same server and key).
    a.execute("%dist_destroy", timeout=60)
    b.execute("%dist_destroy", timeout=60)
    from .conftest import form

    form([a, b], port)
    r1 = round_of(store)
    assert r1 > r0
    thread, box = follow_in(b, port, 1)
    store.set(f"nbdist/r/{r1}/drive/1", json.dumps(genuine))
    why = _refused(thread, box)
    assert f"signed for world round {r0}" in why and f"this world is round {r1}" in why, why
    assert open(path + ".1").read() == "x"

    # 4. Not even a message: refused as such, not a traceback.
    thread, box = follow_in(b, port, 1)
    store.set(f"nbdist/r/{r1}/drive/{store.add(f'nbdist/r/{r1}/drive/seq', 0) + 1}", "import os")
    assert "not a message nbdist sends" in _refused(thread, box)
