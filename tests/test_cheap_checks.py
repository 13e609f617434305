"""Cheap checking of repeated collectives, and ``%%collective --trace``.

The first call of each kind in a cell is compared before it runs (tests/test_faults.py covers
those); a later call of a kind already compared runs at once and is compared when it outlasts a
wait slice, or at the end of the body. Every mismatch is still caught, named, on every rank.
The tests share one two-rank world; each ends with a cell that must work again.
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterator

import pytest

from nbdist.cell import cells, history
from nbdist.cell.fingerprint import differences
from nbdist.drive import kernels
from nbdist.view import trace
from nbdist.world.records import Note

from .conftest import lend, ok

ALL_REDUCE = "%%collective --timeout 20\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"


@pytest.fixture
def world(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, ALL_REDUCE)


def mismatch_everywhere(ks: list[kernels.Kernel], code: str, *expected: str, record=None) -> list[str]:
    t0 = time.monotonic()
    results = kernels.execute_all(ks, code, timeout=60)
    if record is not None:
        record(time.monotonic() - t0)
    for rank, r in enumerate(results):
        assert r.status == "error" and r.error["ename"] == "CollectiveMismatchError", (rank, r.error)
        for text in expected:
            assert text in r.error["evalue"], (rank, r.error["evalue"])
    for r in ok(kernels.execute_all(ks, ALL_REDUCE, timeout=60)):  # the world still works
        assert "2.0" in r.text()
    return [r.error["evalue"] for r in results]


@pytest.mark.timeout(120)
def test_a_loop_of_matching_collectives_runs_and_gives_the_right_result(world):
    code = "%%collective\nt = torch.ones(3)\nfor _ in range(50):\n    dist.all_reduce(t)\nt.tolist()\n"
    for r in ok(kernels.execute_all(world, code, timeout=60)):
        assert str([2.0 ** 50] * 3) in r.text()


@pytest.mark.timeout(120)
def test_a_new_kind_on_one_rank_after_a_loop_is_named_while_the_other_waits(world, record_fault):
    code = ("%%collective\nfor _ in range(5):\n    dist.all_reduce(torch.ones(2))\n"
            "dist.all_reduce(torch.ones(2 + RANK))\n")
    mismatch_everywhere(world, code, "collective #6 (all_reduce) of this cell does not match across ranks",
                        "tensor differs (rank 0: shape [2]; rank 1: shape [3])",
                        record=lambda s: record_fault("a new shape on one rank after 5 matching all_reduces", s))


@pytest.mark.timeout(120)
def test_kinds_seen_before_in_a_different_order_are_named_even_when_gloo_completes_one_side(world):
    # Both shapes were compared before; gloo completes rank 0's 2-element all_reduce against rank 1's
    # 3-element one and leaves rank 1 waiting: the rank that waits compares with the finished one's record.
    code = ("%%collective\na, b = torch.ones(2), torch.ones(3)\nfor _ in range(3):\n"
            "    dist.all_reduce(a)\n    dist.all_reduce(b)\ndist.all_reduce(a if RANK == 0 else b)\n")
    mismatch_everywhere(world, code, "collective #7 (all_reduce) of this cell did not match across ranks",
                        "tensor differs (rank 0: shape [2]; rank 1: shape [3])")


@pytest.mark.timeout(120)
def test_kinds_seen_before_that_hang_in_different_ops_are_named_on_both_ranks(world, record_fault):
    code = ("%%collective --timeout 30\nt = torch.ones(4)\ndist.all_reduce(t)\ndist.broadcast(t, src=0)\n"
            "if RANK == 0:\n    dist.all_reduce(t)\nelse:\n    dist.broadcast(t, src=0)\n")
    mismatch_everywhere(world, code, "collective #3 (", "op differs (rank 0: all_reduce; rank 1: broadcast)",
                        record=lambda s: record_fault("repeated kinds in different ops (a hang)", s))


@pytest.mark.timeout(120)
def test_a_mismatch_that_does_not_hang_fails_the_cell_on_every_rank_naming_the_collective(world, record_fault):
    code = ("%%collective\nops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX]\nt = torch.ones(1)\nfor i in range(6):\n"
            "    dist.all_reduce(t, op=ops[1] if (i == 4 and RANK == 1) else ops[i % 2])\n")
    mismatch_everywhere(world, code, "collective #5 (all_reduce) of this cell did not match across ranks",
                        "reduce_op differs (rank 0: RedOpType.SUM; rank 1: RedOpType.MAX)", "It ran",
                        record=lambda s: record_fault("repeated kinds, reduce ops differ (no hang)", s))


@pytest.mark.timeout(120)
def test_an_extra_collective_of_a_known_kind_is_named(world):
    code = "%%collective\nt = torch.ones(1)\nfor _ in range(3):\n    dist.all_reduce(t)\nif RANK == 0:\n" \
           "    dist.all_reduce(t)\n"
    mismatch_everywhere(world, code, "finished this cell after 3 collective(s), but rank 0", "issued #4 (all_reduce)")


@pytest.mark.timeout(120)
def test_trace_records_every_collective_in_order_and_names_the_late_rank(world):
    code = ("%%collective --trace\nimport time\nt = torch.ones(1000)\ndist.all_reduce(t)\n"
            "if RANK == 1:\n    time.sleep(1)\ndist.all_reduce(t)\ndist.broadcast(t, src=0)\n")
    results = ok(kernels.execute_all(world, code, timeout=60))
    for r in results:
        shown = [o["content"]["data"] for o in r.outputs if o["msg_type"] == "display_data"]
        timeline = [d for d in shown if "timeline of 3 collective(s) on 2 rank(s)" in d.get("text/plain", "")]
        assert timeline and timeline[-1]["image/png"], shown
        # About 1 s: each rank counts from its own exit of the start barrier, and left all_reduce #1 at its own time.
        assert re.search(r"rank 1 is (1\.\d s|9\d\d\.\d ms) late at all_reduce #2", timeline[-1]["text/plain"]), \
            timeline[-1]["text/plain"]
    calls = ast.literal_eval(world[0].execute("import nbdist\nnbdist.last_trace()").text())
    assert sorted((c["rank"], c["seq"], c["op"]) for c in calls) == [
        (rank, seq, op) for rank in (0, 1) for seq, op in ((1, "all_reduce"), (2, "all_reduce"), (3, "broadcast"))]
    assert all(c["bytes"] == 4000 and 0 <= c["enter"] <= c["leave"] for c in calls)
    rows = trace.lateness(calls)
    assert [(r["seq"], r["op"]) for r in rows] == [(1, "all_reduce"), (2, "all_reduce"), (3, "broadcast")]
    second = rows[1]
    # The sleep is 1 s; the upper bound only says it is that sleep (not a --timeout), with room for 2 busy cores.
    assert second["last"] == 1 and 0.9 < second["late"] < 3.0, second
    assert 0.9 < second["waits"][0] < 3.0 and second["waits"][1] == 0
    # Rank 0 entered its second all_reduce before rank 1 slept, and left it after rank 1 arrived.
    mine = {(c["rank"], c["seq"]): c for c in calls}
    assert mine[(0, 2)]["leave"] >= mine[(1, 2)]["enter"] - 0.05


@pytest.mark.timeout(120)
def test_trace_must_be_given_on_every_rank(world):
    results = kernels.execute_all(world, ["%%collective --trace\nx = 1\n", "%%collective\nx = 1\n"], timeout=60)
    for r in results:
        assert r.status == "error" and r.error["ename"] == "CellMismatchError", r.error
        assert "--trace" in r.error["evalue"]


@pytest.mark.timeout(120)
def test_a_long_collective_is_noted_as_part_of_the_body_and_the_note_is_taken_back_after_it(world):
    # Other ranks' end barriers wait for a rank whose note says it runs the body: the note of a long
    # collective must keep saying so, and must not outlive the collective.
    code = ("%%collective\nimport time\n_w = get_ipython().magics_manager.registry['DistMagics'].session.world\n"
            "_notes = []\nt = torch.ones(1)\ndist.all_reduce(t)\nif RANK == 1:\n    time.sleep(1.2)\n"
            "    _notes.append(_w.client.get_json_if(_w.key('last/0')))\n    time.sleep(0.3)\n"
            "dist.all_reduce(t)\nif RANK == 1:\n    time.sleep(0.5)\n"
            "    _notes.append(_w.client.get_json_if(_w.key('last/0')))\nelse:\n    time.sleep(1.0)\n")
    ok(kernels.execute_all(world, code, timeout=60))
    during, after = ast.literal_eval(world[1].execute("_notes").text())
    assert during["what"].startswith("inside collective #2 (all_reduce) of %%collective #"), during
    assert after["what"].startswith("running %%collective #"), after
    assert during["body"] == after["body"] and during["body"].startswith("t/")


def test_a_rank_waiting_for_a_comparison_in_the_body_is_at_work_in_the_cell():
    cell = "t/7"
    assert cells.at_work(cell, Note("running %%collective #7", 1.0, body=cell))
    assert cells.at_work(cell, Note("waiting at collective #3 (all_reduce) of this cell", 1.0,
                                    barrier=f"{cell}/fp/0/3"))
    assert not cells.at_work(cell, Note("waiting at %%collective #7 (end)", 1.0, barrier=f"{cell}/out"))
    assert not cells.at_work(cell, Note("running %%collective #6", 1.0, body="t/6"))
    assert not cells.at_work(cell, None)  # no note yet


# --- pure logic -----------------------------------------------------------------------------
def _checks(crcs: list[int], sigs: dict[int, dict]) -> dict:
    hist = history.History()
    for crc in crcs:
        hist.add(crc)
    return history.summary({"0": hist}, sigs)


def test_runs_are_kept_run_length_encoded_and_the_first_difference_is_found_inside_a_run():
    a, b = {"op": "all_reduce", "reduce_op": "SUM"}, {"op": "all_reduce", "reduce_op": "MAX"}
    sigs = {1: a, 2: b}
    left = _checks([1] * 100 + [2] * 3, sigs)
    right = _checks([1] * 60 + [2] + [1] * 39 + [2] * 3, sigs)
    assert left["groups"]["0"]["runs"] == [[1, 100], [2, 3]]
    why = history.end_mismatch({0: left, 1: right}, differences)
    assert why is not None and why.startswith("collective #61 (all_reduce) of this cell did not match")
    assert "reduce_op differs (rank 0: SUM; rank 1: MAX)" in why
    assert history.end_mismatch({0: left, 1: _checks([1] * 100 + [2] * 3, sigs)}, differences) is None


def test_a_difference_beyond_the_kept_runs_is_still_reported_without_a_position():
    sigs = {i: {"op": "all_reduce", "tensor": {"shape": [i]}} for i in range(1, 4)}
    many = [1, 2] * history.MAX_RUNS  # every call a new run: the runs list fills up
    left, right = _checks(many + [1], sigs), _checks(many + [3], sigs)
    assert left["groups"]["0"]["truncated"] and len(left["groups"]["0"]["runs"]) == history.MAX_RUNS
    why = history.end_mismatch({0: left, 1: right}, differences)
    assert why is not None and "did not match" in why and "beyond what was kept" in why


def test_lateness_and_headline_name_the_last_rank_per_collective():
    calls = [
        {"rank": 0, "group": "0", "seq": 1, "op": "all_reduce", "bytes": 4, "enter": 0.0, "leave": 2.1},
        {"rank": 1, "group": "0", "seq": 1, "op": "all_reduce", "bytes": 4, "enter": 2.1, "leave": 2.1},
        {"rank": 0, "group": "0", "seq": 2, "op": "broadcast", "bytes": 4, "enter": 2.2, "leave": 2.3},
        {"rank": 1, "group": "0", "seq": 2, "op": "broadcast", "bytes": 4, "enter": 2.2, "leave": 2.3},
        {"rank": 0, "group": "0", "seq": None, "op": "send", "bytes": 4, "enter": 2.4, "leave": 2.5},
    ]
    rows = trace.lateness(calls)
    assert [(r["seq"], r["last"], round(r["late"], 3)) for r in rows] == [(1, 1, 2.1), (2, 0, 0.0)]
    assert rows[0]["waits"] == {0: 2.1, 1: 0.0}
    assert trace.headline(rows, 2) == ["rank 1 is 2.1 s late at all_reduce #1"]
    assert trace.size_of({"op": "all_gather", "tensor_list": [{"shape": [2, 3], "dtype": "float32"}] * 2,
                          "tensor": {"shape": [2, 3], "dtype": "float32"}}) == 48
