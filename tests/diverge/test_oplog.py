"""The comparison of operation logs, as tables: every rank's log built by hand, the rounds answered from them all
(what the gathers of :mod:`nbdist.diverge.oplog` carry between kernels)."""

from __future__ import annotations

import pytest

from nbdist.diverge import firstdiff
from nbdist.diverge.oplog import Op, OpLog


def log_of(ops: list[tuple[str, int | None]], limit: int = 1000) -> OpLog:
    log = OpLog(limit)
    for i, (name, digest) in enumerate(ops):
        log.add(Op(name, "f32[2]", digest, line=i + 2))
    return log


def found(logs: list[OpLog], replicas: list[int] | None = None) -> firstdiff.Finding:
    rounds = []

    def ask(question):  # type: ignore[no-untyped-def]
        rounds.append(question)
        return [question(log) for log in logs]

    return firstdiff.compare(ask, lambda q: [q(log) for log in logs], len(logs), replicas)


A = [("aten.ones", 1), ("aten.mul", 2), ("aten.add", 3), ("aten.sum", 4)]


@pytest.mark.parametrize(("logs", "replicas", "first", "first_name"), [
    ([A, A], None, None, None),  # all agree
    ([A, A[:2] + [("aten.add", 9)] + A[3:]], None, 2, None),  # a hash differs at the third
    ([A, A, A, [("aten.ones", 7)] + A[1:]], None, 0, None),  # the very first, on one rank of four
    ([A, A[:1] + A[2:]], None, 1, 1),  # an operation skipped on one rank: names differ there
    ([A, A[:3]], None, 3, 3),  # one log ends early
    ([A, A, [("x", 0)], [("y", 0)]], [0, 1], None, None),  # --replicas 0,1: the others may differ
    ([A, [("x", 0)], A, A], [0, 2, 3], None, None),
    ([A, A[:2] + [("aten.add", 9), ("aten.neg", 5)]], None, 2, 3),  # the hash first, the name later
    ([[("aten.empty", None)] + A, [("aten.empty", None)] + A], None, None, None),  # uncompared outputs agree
])
def test_the_first_differing_operation(logs, replicas, first, first_name) -> None:  # type: ignore[no-untyped-def]
    f = found([log_of(ops) for ops in logs], replicas)
    assert (f.first, f.first_name) == (first, first_name)


def test_a_long_log_is_searched_in_few_rounds() -> None:
    n = 5000
    ops = [(f"op{i}", i) for i in range(n)]
    changed = ops[:3210] + [("op3210", -1)] + ops[3211:]
    rounds = []
    logs = [log_of(ops, n), log_of(changed, n)]

    def ask(question):  # type: ignore[no-untyped-def]
        rounds.append(1)
        return [question(log) for log in logs]

    f = firstdiff.compare(ask, lambda q: [q(log) for log in logs], 2)
    assert f.first == 3210
    assert len(rounds) <= 1 + 14  # the head, then a binary search over 5,000 prefixes


def test_recording_stops_at_the_limit_and_says_so() -> None:
    logs = [log_of(A * 3, limit=5), log_of(A * 3, limit=5)]
    assert [len(log) for log in logs] == [5, 5] and logs[0].unrecorded == 7
    text = firstdiff.describe(found(logs))
    assert text == ("find-divergence: all 5 operations agreed on ranks 0,1. Recording stopped at the first 5 "
                    "operations (7 more ran unrecorded).")


def test_all_agree_is_one_line() -> None:
    assert firstdiff.describe(found([log_of(A)] * 4)) == "find-divergence: all 4 operations agreed on ranks 0-3."
    assert firstdiff.describe(found([log_of(A), log_of(A), log_of([])], [0, 1])) == (
        "find-divergence: all 4 operations agreed on ranks 0,1 (--replicas).")


def test_the_answer_names_the_operation_its_line_the_ranks_by_hash_and_what_agreed_before() -> None:
    b = A[:2] + [("aten.add", 9)] + A[3:]
    text = firstdiff.describe(found([log_of(A), log_of(b), log_of(A)]))
    assert text.splitlines() == [
        "find-divergence: ranks 0-2 part ways at operation #3, line 4: aten.add → f32[2]; its output by rank:",
        "  ranks 0,2: hash 0000000000000003",
        "  rank 1: hash 0000000000000009",
        "before it, ranks 0-2 agreed on 2 operation(s); the last 2:",
        "  #1 line 2: aten.ones → f32[2]",
        "  #2 line 3: aten.mul → f32[2]",
    ]


def test_a_skipped_operation_names_what_each_rank_ran_instead() -> None:
    text = firstdiff.describe(found([log_of(A), log_of(A[:1] + A[2:]), log_of(A[:1])]))
    assert "part ways at operation #2: they ran different operations, or at different lines:" in text
    assert "  rank 0: #2 line 3: aten.mul → f32[2] (hash 0000000000000002)" in text
    assert "  rank 1: #2 line 3: aten.add → f32[2] (hash 0000000000000003)" in text
    assert "  rank 2: its log ended after 1 operation(s)" in text


def test_a_later_name_difference_is_said_too() -> None:
    b = A[:2] + [("aten.add", 9), ("aten.neg", 5)]
    text = firstdiff.describe(found([log_of(A), log_of(b)]))
    assert "the operations themselves first differ at #4:" in text
    assert "  rank 1: #4 line 5: aten.neg → f32[2]" in text


def test_a_collectives_digest_comes_when_it_completes() -> None:
    log = log_of(A)
    before = log.prefix(4)
    log.settle(1, 2)  # the same digest: nothing changes
    assert log.prefix(4) == before
    log.settle(1, 99)
    assert log.prefix(1) == log_of(A).prefix(1) and log.prefix(2) != before and log.prefix(4) != before


@pytest.mark.parametrize(("found", "line"), [
    ([], None),
    ([("/tmp/ipykernel_1/9.py", 5)], 5),
    # A helper made in the running cell (innermost first): its own line there.
    ([("/tmp/ipykernel_1/9.py", 2), ("/tmp/ipykernel_1/9.py", 5)], 2),
    # A helper made in an earlier cell: the running cell's line that called it, not the other cell's line.
    ([("/tmp/ipykernel_1/4.py", 3), ("/tmp/ipykernel_1/9.py", 5)], 5),
])
def test_an_operation_is_named_by_a_line_of_the_running_cell(found, line):
    from nbdist.diverge.oplog import _innermost_of_running

    assert _innermost_of_running(found) == line
