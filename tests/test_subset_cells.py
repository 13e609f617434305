"""``%%collective --ranks 0-1``: the body runs on some ranks, the others skip it and stay in step.

Real kernels, one shared three-rank world on loopback; the pure pieces (the flag, its round trip to a
follower, the refusal's words) are tested first, without a kernel.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from nbdist.cell import cells
from nbdist.cell.fingerprint import peer_of, skipped_message
from nbdist.drive import kernels
from nbdist.errors import CollectiveError, ConfigError, SkippedRanksError, by_name
from nbdist.world.records import Arrival, CellStart
from nbdist.world.verdict import Kind

from .conftest import lend, ok, shared_world

ALL_REDUCE = "%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())\n"
SEND_PARAMS = ["tensor", "dst", "group", "tag", "group_dst"]
RECV_PARAMS = ["tensor", "src", "group", "tag", "group_src"]


# --- pure: no kernel --------------------------------------------------------------------------


def test_a_rank_set_is_read_into_sorted_ranks_and_none_without_the_flag():
    assert cells.rank_set("0-2,5", 8) == (0, 1, 2, 5)
    assert cells.rank_set("all", 3) == (0, 1, 2)
    assert cells.rank_set(None, 3) is None


@pytest.mark.parametrize(("text", "words"), [
    ("0-", "'0-' is not a rank set"),
    ("2-1", "'2-1' is not a range of ranks"),
    ("7", "names rank 7, but this world's ranks are 0-2"),
])
def test_a_malformed_or_out_of_range_rank_set_is_a_config_error_naming_the_flag(text, words):
    with pytest.raises(ConfigError) as caught:
        cells.rank_set(text, 3)
    message = str(caught.value)
    assert message.startswith("--ranks: ") and words in message and "\n" not in message, message


def test_the_ranks_reach_a_follower_through_json_as_the_same_flags():
    flags = cells.Flags(30.0, check=False, ranks=(0, 1, 3))
    sent = json.loads(json.dumps(flags.sent()))
    assert sent["ranks"] == [0, 1, 3]
    again = cells.Flags.received(sent)
    assert again == flags and again.ranks == (0, 1, 3)
    assert cells.Flags.received(json.loads(json.dumps(cells.Flags(30.0).sent()))).ranks is None


def test_the_ranks_are_compared_across_ranks_and_a_difference_is_refused_naming_each_set():
    records = [Arrival("cell", "%%collective #1 (start)", CellStart("h", "x = 1", {"ok": True},
                                                                    cells.Flags(30.0, ranks=r).compared()))
               for r in ((0, 1), (0, 1), (0, 1, 2))]
    verdict = cells.start_verdict(None, records)  # type: ignore[arg-type]  # a flags refusal needs no world
    assert verdict.kind is Kind.REFUSED, verdict
    assert verdict.why.startswith("the ranks ran %%collective with different flags"), verdict
    assert "ranks 0,1: --ranks 0,1" in verdict.why and "rank 2: --ranks 0-2" in verdict.why, verdict


def test_a_skipped_ranks_capture_is_one_note_without_error_or_time():
    cap = cells.skipped((0, 1, 2, 3))
    assert cap.outputs == [{"kind": "note", "text": "skipped: this cell runs on ranks 0-3 only (--ranks)"}]
    assert cap.error is None and cap.wall == 0.0
    assert cells.skipped((2,)).outputs[0]["text"] == "skipped: this cell runs on rank 2 only (--ranks)"


def test_the_refusal_names_the_op_the_skipped_ranks_and_the_subgroup_idiom():
    text = skipped_message("all_reduce", None, [4, 5, 6, 7], (0, 1, 2, 3), 8)
    assert text.startswith("dist.all_reduce on the default group (every rank) would wait for ranks 4-7, which skip "
                           "this cell (--ranks 0-3)"), text
    assert "`sub = dist.new_group([0, 1, 2, 3])`" in text and "`dist.all_reduce(..., group=sub)`" in text, text
    one = skipped_message("broadcast", [0, 1, 2], [2], (0, 1), 4)
    assert "on a group of ranks 0-2 would wait for rank 2, which skips this cell" in one, one
    p2p = skipped_message("send", None, [3], (0, 1), 4, p2p=True)
    assert "dist.send would wait for rank 3" in p2p and "new_group" not in p2p, p2p


def test_the_refusal_is_the_same_class_on_every_rank_and_a_collective_error():
    assert by_name("SkippedRanksError") is SkippedRanksError and issubclass(SkippedRanksError, CollectiveError)


def test_a_send_or_recv_waits_for_its_peer_in_world_ranks():
    assert peer_of(SEND_PARAMS, ("t", 2), {}, None) == 2
    assert peer_of(RECV_PARAMS, ("t",), {"src": 1}, None) == 1
    assert peer_of(SEND_PARAMS, ("t",), {"group_dst": 1}, [4, 6]) == 6  # a group's rank 1 is world rank 6
    assert peer_of(RECV_PARAMS, ("t",), {}, None) is None  # any source: nothing to refuse


# --- real kernels: one shared three-rank world ---------------------------------------------------


@pytest.fixture(scope="module")
def shared3() -> Iterator:
    with shared_world(3) as world:
        yield world


@pytest.fixture
def world(shared3) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared3, ALL_REDUCE.replace("60", "20"))


def step_of(r: kernels.Result) -> int:
    """The step number in a cell's table title (``%%collective #N``)."""
    found = re.findall(r"%%collective #(\d+)", r.text())
    assert found, r.text()
    return int(found[-1])


def works(ks: list[kernels.Kernel]) -> list[int]:
    """A full cell's world all_reduce runs on every rank with the right sum; returns each rank's step."""
    results = ok(kernels.execute_all(ks, ALL_REDUCE, timeout=60))
    for r in results:
        assert "sum 3.0" in r.text(), r.text()
    return [step_of(r) for r in results]


def has(ks: list[kernels.Kernel], name: str) -> list[bool]:
    return [k.execute("", user_expressions={"x": f"{name!r} in globals()"}).expression("x") == "True" for k in ks]


@pytest.mark.timeout(180)
def test_the_body_runs_only_on_the_given_ranks_and_the_skipped_column_says_why(world):
    results = ok(kernels.execute_all(world, "%%collective --ranks 0-1\nonly_here = RANK\nprint('ran on', RANK)\n",
                                     timeout=60))
    assert has(world, "only_here") == [True, True, False]
    for r in results:
        html = r.displays()[-1]
        assert "skipped: this cell runs on ranks 0,1 only (--ranks)" in html, html
        assert "ran on 0" in html and "ran on 1" in html and "ran on 2" not in html, html


@pytest.mark.timeout(180)
def test_the_world_stays_in_step_after_a_subset_cell(world):
    before = works(world)
    subset = ok(kernels.execute_all(world, "%%collective --ranks 2\nprint('alone')\n", timeout=60))
    after = works(world)
    assert len(set(before)) == 1 and len(set(after)) == 1, (before, after)
    assert [step_of(r) for r in subset] == [before[0] + 1] * 3 and after[0] == before[0] + 2, (before, after)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flag", ["", "--no-check "])
def test_a_world_all_reduce_in_a_subset_cell_is_refused_at_once_naming_new_group_and_no_rank_hangs(world, flag):
    code = f"%%collective {flag}--timeout 60 --ranks 0-1\nt = torch.ones(1)\ndist.all_reduce(t)\nafter = 1\n"
    t0 = time.monotonic()
    results = kernels.execute_all(world, code, timeout=60)
    took = time.monotonic() - t0
    assert took < 10, f"the refusal took {took:.1f} s"
    assert [r.status for r in results] == ["error"] * 3, [r.error for r in results]
    for r in results:  # the skipped rank ends with the members' error, too
        assert r.error["ename"] == "SkippedRanksError", r.error
        message = r.error["evalue"]
        assert "dist.all_reduce on the default group (every rank) would wait for rank 2, which skips" in message
        assert "`sub = dist.new_group([0, 1])`" in message, message
    assert has(world, "after") == [False, False, False]
    works(world)


@pytest.mark.timeout(180)
def test_a_tutorials_setup_after_its_cleanup_in_a_subset_cell_is_refused_and_the_next_full_cell_works(world):
    code = ("%%collective --ranks 0-1\ndist.destroy_process_group()\n"
            "dist.init_process_group('gloo', rank=RANK, world_size=WORLD_SIZE)\nafter = 1\n")
    results = kernels.execute_all(world, code, timeout=60)
    assert [r.status for r in results] == ["error"] * 3, [r.error for r in results]
    for r in results:  # the skipped rank ends with the members' error, too
        text = f"{r.error['ename']}: {r.error['evalue']}"
        assert "InitProcessGroupError" in text and "the world's process group needs every rank" in text, text
    assert has(world, "after") == [False, False, False]
    works(world)


@pytest.mark.timeout(180)
def test_a_subgroup_all_reduce_and_a_send_between_the_cells_ranks_work(world):
    ok(kernels.execute_all(world, "%%collective\nsub = dist.new_group([0, 1])\n", timeout=60))
    code = ("%%collective --ranks 0-1\nt = torch.ones(1) * (RANK + 1)\ndist.all_reduce(t, group=sub)\n"
            "print('sub sum', t.item())\nr = torch.zeros(1)\n"
            "if RANK == 0:\n    dist.send(torch.full((1,), 7.0), dst=1)\nelse:\n    dist.recv(r, src=0)\n"
            "print('got', r.item())\n")
    for r in ok(kernels.execute_all(world, code, timeout=60)):
        html = r.displays()[-1]
        assert html.count("sub sum 3.0") == 2 and "got 7.0" in html, html  # ranks 0 and 1 each summed 1 + 2
        assert "skipped: this cell runs on ranks 0,1 only (--ranks)" in html, html
    works(world)


@pytest.mark.timeout(180)
def test_a_send_to_a_skipped_rank_is_refused_on_the_sender(world):
    code = "%%collective --ranks 0-1\nif RANK == 0:\n    dist.send(torch.ones(1), dst=2)\n"
    t0 = time.monotonic()
    results = kernels.execute_all(world, code, timeout=60)
    assert time.monotonic() - t0 < 10
    assert [r.status for r in results] == ["error"] * 3, [r.error for r in results]
    assert "dist.send would wait for rank 2, which skips this cell" in results[0].error["evalue"], results[0].error
    works(world)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("ranks", "words"), [
    ("0-", "--ranks: '0-' is not a rank set: write ranks and ranges such as 0-3,5"),
    ("7", "--ranks: rank set '7' names rank 7, but this world's ranks are 0-2"),
])
def test_a_malformed_or_out_of_range_rank_set_is_refused_before_anything_runs(world, ranks, words):
    results = kernels.execute_all(world, f"%%collective --ranks {ranks}\nran = 1\n", timeout=60)
    for r in results:
        assert r.status == "error" and r.error["ename"] == "ConfigError", r.error
        assert r.error["evalue"] == words, r.error
        assert r.error["traceback"] == [f"ConfigError: {words}"], r.error  # one line
    assert has(world, "ran") == [False, False, False]
    works(world)


@pytest.mark.timeout(180)
def test_ranks_giving_different_rank_sets_are_refused_on_every_rank(world):
    codes = [f"%%collective --ranks {r}\nran = 1\n" for r in ("0-1", "0-1", "0-2")]
    for r in kernels.execute_all(world, codes, timeout=60):
        assert r.status == "error" and r.error["ename"] == "CellMismatchError", r.error
        assert "different flags" in r.error["evalue"] and "--ranks 0,1" in r.error["evalue"], r.error
        assert "rank 2: --ranks 0-2" in r.error["evalue"], r.error
    assert has(world, "ran") == [False, False, False]
    works(world)


@pytest.mark.timeout(180)
def test_the_skipped_ranks_wait_past_timeout_for_a_member_still_running_its_body(world):
    results = ok(kernels.execute_all(world, "%%collective --timeout 1 --ranks 0\nimport time\ntime.sleep(2.5)\n"
                                            "print('slept')\n", timeout=60))
    for r in results:
        html = r.displays()[-1]
        assert "slept" in html and "skipped: this cell runs on rank 0 only (--ranks)" in html, html
    works(world)
