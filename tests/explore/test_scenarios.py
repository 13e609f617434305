"""The lockstep protocol under every interleaving of two ranks within a preemption bound, and random ones of three: the
stop button and a killed kernel at every store operation, the typo race CI met, a barrier against a cell, F1, F2 (a
stop anywhere in a step that rebuilds the process group: :mod:`.groups` models torch's set-up), F5 (a driving
notebook stopped while it publishes its cell to its followers), F6 and F7 (a stop that nbdist sends, landing where
the kernel's stopper raises it), a body that raises before or after its collective, a rank that never comes, a re-run
of %%dist_init, a killed kernel restarted (a driven worker too), %dist_status read as a cell ends, and a kernel held
up anywhere in a cell. Real server,
real TCP, no kernels; virtual time. ``python -m tests.explore`` runs the same for longer."""

from __future__ import annotations

from .explorer import Lab, Result, exhaustive, randomly
from .invariants import Violation
from .scenarios import scenario

# Bounds sized for CI (2 cores, about 30 s for this file); longer runs: python -m tests.explore --bound 3.
MEET_BOUND = 1  # 1372 interleavings
KILL_BOUND = 1  # 514
TYPO_BOUND = 2  # 556
REFUSAL_BOUND = 3  # 336
LATE_BOUND = 1  # 87 (with F1's fix reverted, the 66th fails)
REBUILD_BOUND = 0  # 166 for a %%collective rebuild; at 1, 4184 (78 s: `python -m tests.explore` runs it)
PLAIN_REBUILD_BOUND = 1  # 1478
RANDOM_SEEDS = 300
RING_SEEDS = 200  # 3 ranks, each reading one beat (looked_at reading none: 23 of 30 fail; no lost: verdict, 79 of 100)
REBUILD_SEEDS = 100  # 3 ranks (with the told-once fix reverted, seed 36 fails)
DRIVE_BOUND = 0  # 66 (with F5's fix reverted, the 24th fails); at 1, 1754 (54 s)
DRIVE_SEEDS = 100  # 3 ranks (with F5's fix reverted, seed 28 fails)
SENT_BOUND = 0  # 174 (with F6's or F7's fix reverted, 8 fail); at 1, 3820 (40 s: `python -m tests.explore`)
SENT_SEEDS = 100  # 3 ranks (with F6's fix reverted 18 of 200 fail, with F7's 17)
DRIVE_SENT_BOUND = 0  # 206 (with F7's fix reverted, 12 fail); at 1, 6826 (105 s)
RAISE_BOUND = 1  # 29 and 37; at 2, 297 and 452
RAISE_SEEDS = 100  # 3 ranks
REJOIN_BOUND = 0  # 126 for a re-run after a cell; at 1, 3766 (47 s: `python -m tests.explore`)
REJOIN_INSTEAD_BOUND = 1  # 25
REJOIN_SEEDS = 100  # 3 ranks
RESTART_BOUND = 0  # 33; at 1, 730 (10 s); at 2, 10048 (150 s)
RESTART_PLAIN_BOUND = 0  # 33 (with the generation bumped at no replacement, 19 fail; 21 of 100 seeds); at 1, 532
# 36 (with enter_generation's re-read of the ranks reverted, 34 fail); at 1, 867 (23-32 s; 371 of 425 fail), which
# runs before a stop (python -m tests.explore --bound 1), not in CI
RESTART_DRIVEN_BOUND = 0
STALL_BOUND = 0  # 88 (with the meeting's "none missing" reverted, 28 fail); at 1, 1476 (51 s)
STALL_SEEDS = 100  # 3 ranks
STATUS_BOUND = 1  # 38 (with ec05cf5's note before the arrival reverted, 2 fail); at 2, 486 (8 s; reverted, 25 fail)


def holds(result: Result, exhausted: bool = True) -> None:
    """Print what was explored; fail with the first failing run (its schedule and trace) or if nothing was."""
    print(f"\n{result.summary()}")
    if result.failures:
        raise Violation(str(result.failures[0]))
    assert result.runs > 0 and result.runs == result.distinct, "runs that repeated a schedule: the search is broken"
    if exhausted:
        assert result.exhausted, f"{result.scenario} stopped before every interleaving within the bound was explored"


def test_a_stop_at_any_gate_of_either_rank_fails_the_other_promptly_naming_it_or_both_open(lab: Lab):
    result = exhaustive(lab, scenario("meet"), MEET_BOUND)
    holds(result)
    assert result.unstopped("ba") == [], "gates of a run where the stop never landed, before or after"
    assert result.runs > 500


def test_a_kernel_killed_at_any_gate_is_named_gone_promptly_by_the_other_rank(lab: Lab):
    result = exhaustive(lab, scenario("meet-kill"), KILL_BOUND)
    holds(result)
    assert result.unstopped("k") == []


def test_a_killed_kernel_seen_only_by_the_rank_before_it_on_the_ring_is_named_gone_promptly_by_every_rank(lab: Lab):
    """Issue 50: in a world larger than liveness.WATCHED + 1, a rank's beat is read by the ranks before it round the
    ring (and the rest now and then); here one rank only, so the others learn of the kill from that one."""
    result = randomly(lab, scenario("meet-kill-ring", ranks=3), range(RING_SEEDS))
    holds(result, exhausted=False)
    assert {rank for rank, _, _ in result.stops} == {0, 1, 2}


def test_a_rank_whose_peer_could_not_start_the_cell_fails_at_once_or_meets_its_rerun_never_waiting_out(lab: Lab):
    result = exhaustive(lab, scenario("typo"), TYPO_BOUND)
    holds(result)
    assert result.runs > 200


def test_a_barrier_against_a_cell_at_the_same_step_is_refused_on_both_ranks_naming_each(lab: Lab):
    result = exhaustive(lab, scenario("barrier-vs-cell"), REFUSAL_BOUND)
    holds(result)
    assert result.runs > 100


def test_a_rank_late_to_a_cell_its_peer_was_stopped_in_before_arriving_never_waits_out_its_timeout(lab: Lab):
    result = exhaustive(lab, scenario("late-after-stop"), LATE_BOUND)
    holds(result)
    assert {(rank, event) for rank, _, event in result.stops} == {(1, "b"), (1, "a")}


def test_a_stop_in_dist_barrier_before_it_arrives_fails_the_other_promptly(lab: Lab):
    result = exhaustive(lab, scenario("barriers"), MEET_BOUND)
    holds(result)
    assert result.unstopped("ba") == []


def test_three_ranks_meet_with_a_stop_on_a_random_rank_at_a_random_gate(lab: Lab):
    result = randomly(lab, scenario("meet", ranks=3), range(RANDOM_SEEDS))
    holds(result, exhausted=False)
    stopped = {rank for rank, _, _ in result.stops}
    assert stopped == {0, 1, 2} and len(result.stops) > 40, sorted(result.stops)


def test_a_stop_anywhere_in_a_collective_cell_that_rebuilds_the_group_leaves_the_ranks_in_step(lab: Lab):
    result = exhaustive(lab, scenario("rebuild"), REBUILD_BOUND)
    holds(result)
    assert result.unstopped("ba") == [], "gates of a run where the stop never landed, before or after"


def test_a_stop_anywhere_in_a_plain_cells_rebuild_leaves_the_ranks_in_step(lab: Lab):
    result = exhaustive(lab, scenario("plain-rebuild"), PLAIN_REBUILD_BOUND)
    holds(result)
    assert result.unstopped("ba") == []


def test_three_ranks_rebuild_with_a_stop_on_a_random_rank_at_a_random_gate(lab: Lab):
    for name in ("rebuild", "plain-rebuild"):
        result = randomly(lab, scenario(name, ranks=3), range(REBUILD_SEEDS))
        holds(result, exhausted=False)
        assert {rank for rank, _, _ in result.stops} == {0, 1, 2}


def test_a_stop_anywhere_in_a_driving_notebooks_cell_leaves_its_followers_in_step_and_following(lab: Lab):
    result = exhaustive(lab, scenario("drive"), DRIVE_BOUND)
    holds(result)
    assert result.unstopped("ba") == [], "gates of a run where the stop never landed, before or after"
    result = randomly(lab, scenario("drive", ranks=3), range(DRIVE_SEEDS))
    holds(result, exhausted=False)
    assert {rank for rank, _, _ in result.stops} == {0}  # the driving notebook: its followers have no stop button


def test_a_stop_nbdist_sends_at_any_gate_ends_its_rank_with_that_stop_and_the_others_promptly_or_not_at_all(lab: Lab):
    result = exhaustive(lab, scenario("meet-sent"), SENT_BOUND)
    holds(result)
    assert result.unstopped("BA") == [], "gates of a run where the sent stop never landed, before or after"
    result = randomly(lab, scenario("meet-sent", ranks=3), range(SENT_SEEDS))
    holds(result, exhausted=False)
    assert {rank for rank, _, _ in result.stops} == {0, 1, 2}


def test_a_stop_sent_to_a_follower_at_any_gate_shows_that_stop_and_it_follows_on(lab: Lab):
    result = exhaustive(lab, scenario("drive-sent"), DRIVE_SENT_BOUND)
    holds(result)
    assert result.unstopped("BA") == []
    assert {rank for rank, _, _ in result.stops} == {1}  # the follower: the driving notebook is sent none here


def test_a_rank_held_up_once_it_noted_its_arrival_at_a_meeting_is_not_missing_there(lab: Lab):
    """A kernel held up (a loaded machine, a person leaving its debugger) anywhere in a cell whose body compares a
    collective; CI met it in test_breakpoints: "Missing: none (they arrived as this rank gave up)"."""
    result = exhaustive(lab, scenario("compare-stall"), STALL_BOUND)
    holds(result)
    assert result.unstopped("s") == [], "gates of a run where the stall never landed"
    holds(randomly(lab, scenario("compare-stall", ranks=3), range(STALL_SEEDS)), exhausted=False)


def test_a_body_that_raises_before_or_after_its_collective_fails_every_rank_naming_its_error(lab: Lab):
    for name in ("raise-before", "raise-after"):
        holds(exhaustive(lab, scenario(name), RAISE_BOUND))
        holds(randomly(lab, scenario(name, ranks=3), range(RAISE_SEEDS)), exhausted=False)


def test_a_rank_that_never_comes_is_waited_for_until_the_timeout_then_named(lab: Lab):
    holds(exhaustive(lab, scenario("never-comes"), RAISE_BOUND))
    holds(randomly(lab, scenario("never-comes", ranks=3), range(RAISE_SEEDS)), exhausted=False)


def test_a_rerun_of_dist_init_after_a_cell_or_a_stop_in_it_joins_every_rank_in_one_new_world(lab: Lab):
    result = exhaustive(lab, scenario("rejoin"), REJOIN_BOUND)
    holds(result)
    assert result.unstopped("ba") == []
    result = randomly(lab, scenario("rejoin", ranks=3), range(REJOIN_SEEDS))
    holds(result, exhausted=False)
    assert {rank for rank, _, _ in result.stops} == {0, 1, 2}


def test_a_rerun_of_dist_init_while_the_others_wait_in_a_cell_fails_them_at_once_naming_it(lab: Lab):
    holds(exhaustive(lab, scenario("rejoin-instead"), REJOIN_INSTEAD_BOUND))
    holds(randomly(lab, scenario("rejoin-instead", ranks=3), range(REJOIN_SEEDS)), exhausted=False)


def test_a_killed_kernel_restarted_takes_its_slot_and_every_ranks_next_cell_rebuilds_the_group(lab: Lab):
    for name, bound in (("restart", RESTART_BOUND), ("restart-plain", RESTART_PLAIN_BOUND)):
        result = exhaustive(lab, scenario(name), bound)
        holds(result)
        assert result.unstopped("k") == []
        holds(randomly(lab, scenario(name, ranks=3), range(REJOIN_SEEDS)), exhausted=False)


def test_a_driven_worker_killed_in_a_cell_and_restarted_follows_again_and_the_next_cell_rebuilds(lab: Lab):
    result = exhaustive(lab, scenario("restart-driven"), RESTART_DRIVEN_BOUND)
    holds(result)
    assert result.unstopped("k") == []
    assert {rank for rank, _, _ in result.stops} == {1}  # the follower: the driver is not killed here
    holds(randomly(lab, scenario("restart-driven", ranks=3), range(REJOIN_SEEDS)), exhausted=False)


def test_a_dist_status_run_as_a_cell_ends_shows_every_rank_past_it_never_still_running_it(lab: Lab):
    result = exhaustive(lab, scenario("status-end"), STATUS_BOUND)
    holds(result)
    assert result.runs > 30
