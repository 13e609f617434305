"""The explorer itself: it explores every interleaving within its bound, a schedule replays to the same run, waits
run out in virtual time, and the real clock is back afterwards. Real server, real TCP, no kernels."""

from __future__ import annotations

import time
from math import comb

import pytest

import nbdist.world.world
from nbdist.errors import WaitTimeout
from nbdist.world import gather
from nbdist.world.gather import Gathering
from nbdist.world.world import World

from .explorer import Hooks, Lab, Scenario, exhaustive, randomly, replay
from .invariants import Violation
from .scenarios import scenario


def interleavings(a: int, b: int, bound: int | None) -> int:
    """How many ways two ranks of ``a`` and ``b`` independent operations interleave with at most ``bound``
    preemptions: with m runs of one rank's operations, all switches but the last are preemptions."""
    total = 0
    for m in range(2, a + b + 1):
        if bound is not None and m - 2 > bound:
            continue
        j = m // 2
        if m % 2 == 0:
            total += 2 * comb(a - 1, j - 1) * comb(b - 1, j - 1)
        else:
            total += comb(a - 1, j) * comb(b - 1, j - 1) + comb(b - 1, j) * comb(a - 1, j - 1)
    return total


def writes(counts: tuple[int, ...]) -> Scenario:
    def program(world: World, h: Hooks) -> None:
        for i in range(counts[world.rank]):
            world.client.set(world.key(f"toy/{world.rank}/{i}"), "x")

    return Scenario("writes", len(counts), program, check=lambda run: None, follow_up=False)


@pytest.mark.parametrize(("a", "b", "bound"), [(3, 3, None), (4, 3, 0), (4, 3, 1), (4, 4, 2), (5, 2, 3)])
def test_two_ranks_of_independent_writes_are_explored_in_every_interleaving_within_the_bound(lab: Lab, a, b, bound):
    result = exhaustive(lab, writes((a, b)), bound)
    print(f"\n{result.summary()}")
    assert result.exhausted
    assert result.runs == result.distinct == interleavings(a, b, bound)
    assert interleavings(a, b, None) == comb(a + b, a)


def test_random_runs_of_three_ranks_draw_different_schedules_and_each_seed_repeats_its_own(lab: Lab):
    toy = writes((3, 3, 3))
    result = randomly(lab, toy, range(40))
    print(f"\n{result.summary()}")
    assert result.runs == 40 and result.distinct >= 30  # 1680 interleavings: few repeats
    again = randomly(lab, toy, range(40))
    assert again.schedules == result.schedules


def test_a_schedule_replays_to_the_same_run(lab: Lab):
    meet = scenario("meet")
    result = exhaustive(lab, meet, bound=1, cap=300)
    stopped = [s for s in sorted(result.schedules) if "a" in s or "b" in s]
    assert stopped, "no run of the first 300 had a stop"
    for schedule in stopped[:: max(1, len(stopped) // 10)]:
        first, why = replay(lab, meet, schedule)
        second, _ = replay(lab, meet, schedule)
        assert why is None
        assert first.schedule == second.schedule == schedule
        assert [str(s) for s in first.trace] == [str(s) for s in second.trace]
        assert [str(o) for o in first.outcomes.values()] == [str(o) for o in second.outcomes.values()]


def test_a_wait_for_a_key_that_never_comes_runs_out_in_virtual_time_not_real_time(lab: Lab):
    def program(world: World, h: Hooks) -> str:
        if world.rank == 0:
            return gather.barrier(world, Gathering("lonely", "a barrier nobody else reaches", 30.0))
        return "idle"

    def must_time_out(run) -> None:
        error = run.outcomes[0].error
        if not isinstance(error, WaitTimeout) or not 30.0 < run.outcomes[0].end < 31.0:
            raise Violation(f"rank 0 {run.outcomes[0]} at {run.outcomes[0].end} s")

    started = time.monotonic()
    result = exhaustive(lab, Scenario("lonely", 2, program, must_time_out, follow_up=False), bound=None)
    assert not result.failures, result.failures[0]
    assert time.monotonic() - started < 10.0  # 300 ticks of 0.1 virtual s, each a handful of store calls
    assert nbdist.world.world.time is time  # the real clock is back


def test_a_schedule_that_does_not_fit_the_run_is_refused(lab: Lab):
    from .scheduler import HarnessError

    with pytest.raises(HarnessError, match="does not fit"):
        replay(lab, scenario("meet"), "2")
