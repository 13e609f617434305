"""What %dist_replay runs again on a restarted rank, and what it says it left (pure: no kernel, no world)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from nbdist.errors import ConfigError, ReplayError
from nbdist.heal import replay
from nbdist.heal.history import Entry, History, choose, entry
from nbdist.world.capture_record import Capture, Raised


def cap(collectives: dict[str, int] | None = None, error: Raised | None = None) -> Capture:
    return Capture(outputs=[], result=None, error=error, wall=0.0, collectives=collectives)


def e(number: int, collectives: int | None = 0, ranks: tuple[int, ...] | None = None, failed: bool = False,
      at: float | None = None, source: str | None = None) -> Entry:
    return Entry(number, source or f"x{number} = {number}", collectives, ranks, failed,
                 float(number) if at is None else at)


# --- an entry from the captures of a cell as it ended ----------------------------------------------
def test_a_cell_whose_ranks_issued_no_collective_counts_none():
    assert entry(1, "import math", None, [cap({}), cap({})], False, 0.0).collectives == 0


def test_the_collectives_of_every_rank_and_group_are_added():
    made = entry(2, "dist.all_reduce(t)", None, [cap({"default": 1}), cap({"default": 1, "sub": 2})], False, 0.0)
    assert made.collectives == 4 and not made.failed


def test_a_collective_on_one_rank_alone_counts():
    assert entry(2, "...", None, [cap({}), cap({"default": 1})], False, 0.0).collectives == 1


def test_a_rank_that_sent_no_capture_leaves_the_count_unknown():
    assert entry(3, "...", None, [cap({}), None], False, 0.0).collectives is None
    assert entry(3, "...", None, [cap({}), cap(None)], False, 0.0).collectives is None
    assert entry(3, "...", None, [], False, 0.0).collectives is None


def test_a_cell_that_raised_on_any_rank_or_was_cut_short_failed():
    assert entry(4, "...", None, [cap({}), cap({}, Raised("NameError", "x"))], False, 0.0).failed
    assert entry(4, "...", None, [cap({}), cap({})], True, 0.0).failed


# --- which cells a rank runs again --------------------------------------------------------------------
def test_the_cells_that_called_no_collective_are_chosen_in_order_and_the_others_named():
    entries = [e(1), e(2, collectives=2), e(3), e(4, collectives=None), e(5, failed=True), e(6)]
    choice = choose(entries, 1, before=None)
    assert [x.number for x in choice.replay] == [1, 3, 6]
    assert [x.number for x in choice.collectives] == [2, 4]  # an unknown count is not taken for none
    assert [x.number for x in choice.failed] == [5]


def test_a_subset_cell_is_replayed_on_the_ranks_it_ran_on_only():
    entries = [e(1, ranks=(0,)), e(2, ranks=(1, 2)), e(3)]
    on_1 = choose(entries, 1, before=None)
    assert [x.number for x in on_1.replay] == [2, 3] and [x.number for x in on_1.elsewhere] == [1]
    on_3 = choose(entries, 3, before=None)
    assert [x.number for x in on_3.replay] == [3] and [x.number for x in on_3.elsewhere] == [1, 2]


def test_only_the_cells_that_ended_before_the_kernels_restart_are_replayed():
    entries = [e(1, at=10.0), e(2, at=20.0), e(3, at=30.0)]
    assert [x.number for x in choose(entries, 1, before=25.0).replay] == [1, 2]  # #3 ran on the new kernel


def test_a_failed_cell_is_not_replayed_even_without_collectives():
    assert choose([e(1, failed=True, collectives=0)], 1, None).replay == []


# --- the history -----------------------------------------------------------------------------------
class Ended:
    def __init__(self, number: int, captures: list[Capture | None], reason: object = None) -> None:
        self.number, self.captures, self.reason = number, captures, reason


def test_the_history_keeps_cells_as_they_ended_and_clears_with_the_world():
    clock = iter([1.0, 2.0, 3.0])
    h = History(clock=lambda: next(clock))
    h.ended("import math", None, Ended(1, [cap({}), cap({})]))
    h.ended("dist.all_reduce(t)", None, Ended(2, [cap({"default": 1}), cap({"default": 1})]))
    h.ended("y = 1", (1,), Ended(3, [cap({}), cap({})], reason="a rank failed"))
    assert [(x.number, x.collectives, x.ranks, x.failed, x.at) for x in h.entries] == [
        (1, 0, None, False, 1.0), (2, 2, None, False, 2.0), (3, 0, (1,), True, 3.0)]
    h.answered({1: 1})
    h.clear()
    assert h.entries == [] and h.replayed == {}


def test_the_default_ranks_are_those_restarted_since_their_last_replay():
    h = History()
    restarts = {1: [5.0], 2: [], 3: [4.0, 9.0]}
    assert h.restarted(restarts) == [1, 3]
    h.answered({1: 1, 3: 1})
    assert h.restarted(restarts) == [3]  # restarted once more since


# --- what %dist_replay prepares and says -----------------------------------------------------------
def history_of(*entries: Entry) -> History:
    h = History()
    h.entries.extend(entries)
    return h


def test_no_rank_restarted_and_no_ranks_named_says_so_in_one_line_and_runs_nothing():
    plan = replay.prepare(history_of(e(1)), None, 2, 0, {1: []})
    assert len(plan.said) == 1 and "nothing to replay" in plan.said[0] and plan.ranks == () and plan.answers == {}


@pytest.mark.parametrize(("text", "said"), [("1-", "not a rank set"), ("x", "not a rank set"),
                                            ("5", "ranks are 0-1"), ("0", "rank 0 is this notebook")])
def test_a_bad_ranks_value_is_refused(text, said):
    with pytest.raises(ConfigError, match=said):
        replay.prepare(history_of(e(1)), text, 2, 0, {})


def test_a_restarted_rank_gets_the_cells_before_its_restart_and_is_told_what_was_left():
    h = history_of(e(1, source="import math\nbase = 41"), e(2, collectives=2, source="t = torch.ones(1)\n"),
                   e(3, source="double = base * 2"), e(4, ranks=(0,)), e(5, failed=True), e(9, at=100.0))
    plan = replay.prepare(h, None, 2, 0, {1: [50.0]})
    assert plan.ranks == (1,) and plan.answers == {1: 1}
    said = "\n".join(plan.said)
    assert ("replaying on rank 1, in order, 2 cells that called no collective: #1 (import math …), "
            "#3 (double = base * 2)") in said, said
    assert "not replayed on rank 1: 1 cell with collectives: #2 (t = torch.ones(1))" in said, said
    assert "%dist_sync NAME... --from 0" in said, said
    assert "1 cell that ran on other ranks only: #4" in said and "1 cell that failed: #5" in said, said
    assert "#9" not in said  # it ran on the new kernel


def test_a_rank_with_nothing_to_replay_is_answered_without_a_step():
    plan = replay.prepare(history_of(e(1, collectives=1)), "1", 2, 0, {})
    assert plan.ranks == () and plan.answers == {1: 0} and "nothing to replay on rank 1" in plan.said[0]


def test_the_body_runs_each_ranks_own_cells_in_its_namespace_and_prints_which(monkeypatch, capsys):
    import torch.distributed as dist

    h = history_of(e(1, source="import math\nbase = 41"), e(2, collectives=1), e(3, source="double = base * 2"),
                   e(4, ranks=(2,), source="only_two = True"))
    plan = replay.prepare(h, "1,2", 3, 0, {})
    assert plan.ranks == (1, 2)
    shell = InteractiveShell.instance()
    ns = shell.user_ns
    for rank in (1, 2):
        monkeypatch.setattr(dist, "get_rank", lambda r=rank: r)  # no torch world here
        for name in ("base", "double", "only_two", "math"):
            ns.pop(name, None)
        exec(compile(plan.body, "<body>", "exec"), {"get_ipython": lambda: shell})
        assert (ns["base"], ns["double"]) == (41, 82) and ("only_two" in ns) == (rank == 2)
        printed = capsys.readouterr().out
        assert "replaying %%collective #3 (double = base * 2)" in printed and "#2" not in printed, printed
        assert f"replayed {2 if rank == 1 else 3} cells" in printed, printed


def test_the_first_cell_that_raises_stops_the_replay_naming_it_and_what_was_not_run():
    shell = InteractiveShell.instance()
    sources = {1: "a_name = 1", 2: "  # set-up\nundefined_name + 1", 3: "never = 1"}
    shell.user_ns.pop("never", None)
    with pytest.raises(ReplayError, match=r"#2 \(undefined_name \+ 1\) raised NameError: .*undefined_name.*; "
                                          r"not run: #3"):
        replay.run(shell, {1: [1, 2, 3]}, sources, rank=1)
    assert shell.user_ns["a_name"] == 1 and "never" not in shell.user_ns


def test_a_magic_in_a_replayed_cell_is_transformed_as_ipython_would():
    shell = InteractiveShell.instance()
    replay.run(shell, {1: [1]}, {1: "%alias_magic replayed_alias pwd"}, rank=1)
    assert "replayed_alias" in shell.magics_manager.magics["line"]


def test_in_a_peer_notebook_ranks_are_refused_in_one_line(monkeypatch):
    from nbdist.healmagics import HealMagics
    from nbdist.magics import DistMagics

    shell = InteractiveShell.instance()
    magics = HealMagics(shell, DistMagics(shell))
    monkeypatch.setattr(magics.session, "require_world", lambda what: object())
    with pytest.raises(UsageError, match="--ranks runs in a driving notebook; in peer notebooks, run") as raised:
        magics.dist_replay("--ranks 1")
    assert "\n" not in str(raised.value)
