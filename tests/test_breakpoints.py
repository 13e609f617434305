"""Breakpoints in a %%collective body on real kernels: relayed from driven ranks to the driving notebook, and in
each peer's own notebook; the others wait past --timeout; c goes on, q and the stop button end the cell."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import ANSI, lend, ok, plain_text, spawned_world, typing

# Rank 1 stops before its all_reduce, where its x is 41 (rank 0's would be 40); --timeout 3 s.
STOPS_ON_RANK_1 = ("%%collective --timeout 3\nx = torch.full((2,), 40.0 + RANK)\nif RANK == 1:\n    breakpoint()\n"
                   "y = x * 10\ndist.all_reduce(x)\nprint('done', RANK, x.tolist())\n")
NEXT = "%%collective\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())"
LOOK = 5.0  # seconds a person reads the first prompt: past the cell's --timeout


def in_the_debugger(r: kernels.Result, rank: int) -> bool:
    """Whether the cell's live table said that ``rank`` was in the debugger at cell line 5."""
    return any(re.search(rf"rank {rank} [^\n]*\n[^\n]*in the debugger at cell line 5", ANSI.sub("", u))
               for u in r.updates())


@pytest.fixture(scope="module")
def driving() -> Iterator[kernels.Kernel]:
    """One notebook driving two spawned workers (``%dist_init --spawn 3``)."""
    with spawned_world(3) as k:
        yield k


@pytest.mark.timeout(300)
def test_rank_1s_breakpoint_is_answered_in_the_driving_notebook_while_the_others_wait_past_their_timeout(driving):
    answer, prompts = typing(["p x", "n", "p y", "c"], first_look=LOOK)
    r = driving.execute(STOPS_ON_RANK_1, timeout=120, stdin=answer)
    shown = plain_text(r)
    assert r.status == "ok", r.error
    assert re.search(r"nbdist: rank 1 \(.+\) stopped at a breakpoint at cell line 4", shown), shown
    assert len(prompts) == 4 and all(re.fullmatch(r"rank 1 \(.+\) ipdb> ", p) for p in prompts), prompts
    assert "tensor([41., 41.])" in shown and "tensor([410., 410.])" in shown, shown  # rank 1's x, then its y
    assert re.search(r"nbdist: rank 1 \(.+\) goes on", shown), shown
    assert "done 2 [123.0, 123.0]" in shown, shown  # every rank went on past --timeout 3 s, together
    assert in_the_debugger(r, 1), r.updates()
    ok([driving.execute(NEXT, timeout=120)])


@pytest.mark.timeout(300)
def test_q_at_a_relayed_prompt_ends_the_cell_on_every_rank_and_the_next_cell_works(driving):
    answer, _ = typing(["q"])
    r = driving.execute(STOPS_ON_RANK_1, timeout=120, stdin=answer)
    assert r.status == "error"
    assert re.search(r"rank 1 \(.+\) quit its debugger \(q\)", r.error["evalue"]), r.error
    assert not re.search(r"done \d \[", plain_text(r)), plain_text(r)  # no rank ran past it
    r = driving.execute(NEXT, timeout=120)
    assert r.status == "ok", r.error
    assert "3.0" in plain_text(r), plain_text(r)  # all three ranks, still following


@pytest.mark.timeout(300)
def test_the_stop_button_at_a_relayed_prompt_ends_the_cell_and_that_ranks_debugger(driving):
    def stop_button(prompt: str) -> None:
        driving.interrupt()  # no reply: only the stop button can end this input()

    r = driving.execute(STOPS_ON_RANK_1, timeout=120, stdin=stop_button)
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r.error
    r = driving.execute(NEXT, timeout=120)
    assert r.status == "ok", r.error
    assert "3.0" in plain_text(r), plain_text(r)


@pytest.mark.timeout(300)
def test_two_ranks_at_a_breakpoint_are_answered_one_after_another_each_prompt_labelled(driving):
    cell = "%%collective\nimport nbdist\nx = RANK * 100\nnbdist.breakpoint(ranks='1,2')\nprint('after', x)\n"
    answer, prompts = typing(["p x", "c", "p x", "c"])
    r = driving.execute(cell, timeout=120, stdin=answer)
    shown = plain_text(r)
    assert r.status == "ok", r.error
    ranks = [int(p.split()[1]) for p in prompts]  # the order they came in (the rank answered last goes first)
    assert sorted(ranks) == [1, 1, 2, 2] and all(re.fullmatch(r"rank [12] \(.+\) ipdb> ", p) for p in prompts), prompts
    assert "\n100\n" in shown and "\n200\n" in shown, shown
    assert "after 0" in shown and "after 200" in shown, shown


@pytest.fixture
def peers(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, NEXT)


@pytest.mark.timeout(300)
def test_in_a_peer_world_rank_1_debugs_in_its_own_notebook_while_rank_0_waits_past_its_timeout(peers):
    answer, prompts = typing(["p x", "c"], first_look=LOOK)
    results = kernels.execute_all(peers, STOPS_ON_RANK_1, timeout=120, stdin=[None, answer])
    ok(results)
    assert prompts == ["ipdb> ", "ipdb> "], prompts
    assert "tensor([41., 41.])" in plain_text(results[1]), plain_text(results[1])
    assert "done 0 [81.0, 81.0]" in plain_text(results[0]), plain_text(results[0])
    assert in_the_debugger(results[0], 1), results[0].updates()  # rank 0's table says where rank 1 is


@pytest.mark.timeout(300)
def test_in_a_peer_world_q_or_the_stop_button_in_the_debugger_ends_the_cell_on_every_rank(peers):
    answer, _ = typing(["q"])
    results = kernels.execute_all(peers, STOPS_ON_RANK_1, timeout=120, stdin=[None, answer])
    assert [r.status for r in results] == ["error", "error"]
    assert re.search(r"rank 1 \(.+\) quit its debugger \(q\)", results[0].error["evalue"]), results[0].error
    assert "quit its debugger (q): the cell ended on every rank" in results[1].error["evalue"], results[1].error
    ok(kernels.execute_all(peers, NEXT, timeout=120))

    def stop_button(prompt: str) -> None:
        peers[1].interrupt()  # no reply: only the stop button can end this input()

    results = kernels.execute_all(peers, STOPS_ON_RANK_1, timeout=120, stdin=[None, stop_button])
    assert [r.status for r in results] == ["error", "error"]
    assert results[1].error["ename"] == "KeyboardInterrupt", results[1].error
    ok(kernels.execute_all(peers, NEXT, timeout=120))


@pytest.mark.timeout(300)
def test_a_notebook_whose_front_end_takes_no_input_skips_its_breakpoint_and_says_so(peers):
    results = ok(kernels.execute_all(peers, "%%collective\nx = RANK\nbreakpoint()\nprint('after', x)\n", timeout=120))
    for rank, r in enumerate(results):  # run without input (as nbclient and nbdist run do): the body goes on
        assert "front end takes no input here: the breakpoint is skipped" in plain_text(r), plain_text(r)
        assert f"after {rank}" in plain_text(r), plain_text(r)
