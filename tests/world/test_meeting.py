"""The decisions of a rank at a meeting, as tables with a fixed clock (nbdist.world.meeting)."""

import pytest

from nbdist.world import meeting
from nbdist.world import verdict as verdicts
from nbdist.world.meeting import Cause, Leave, Missing, Next, Seen

T0 = 1000.0  # the fixed clock: every "now" below is T0 plus seconds
DEADLINE = T0 + 30.0
GO, REBUILD = verdicts.GO, verdicts.rebuild("rank 1 raised")
REFUSED, CLOSED = verdicts.refused("different cells"), verdicts.closed("rank 1 (h, pid 7) interrupted its cell")


@pytest.mark.parametrize(("count", "expected", "next_"), [
    (1, 2, Next.WAIT), (2, 2, Next.DECIDE), (3, 4, Next.WAIT), (4, 4, Next.DECIDE),
    (5, 4, Next.DECIDE),  # a rank that re-counts itself after a restart must not leave the meeting undecided
])
def test_the_last_to_arrive_decides_and_the_others_wait(count, expected, next_):
    assert meeting.arrived(count, expected) is next_


@pytest.mark.parametrize(("seen", "now", "waits_for_work", "next_"), [
    # A decided meeting is read alike by every rank, whatever the clock says.
    (Seen(GO), T0, False, Next.OPENED),
    (Seen(REBUILD), DEADLINE + 99, True, Next.OPENED),
    (Seen(verdicts.go("found")), T0, False, Next.OPENED),
    (Seen(REFUSED), T0, True, Next.REFUSED),
    (Seen(CLOSED), DEADLINE + 1, False, Next.CLOSED),
    # Undecided, before or at the deadline: wait on.
    (Seen(None), T0, False, Next.WAIT),
    (Seen(None), DEADLINE, False, Next.WAIT),
    (Seen(None), DEADLINE, True, Next.WAIT),
    # Past it: look at the missing ranks first.
    (Seen(None), DEADLINE + 0.01, False, Next.READ_MISSING),
    (Seen(None), DEADLINE + 0.01, True, Next.READ_MISSING),
    # None missing: every rank noted its arrival, and the last is deciding (held up, say): wait on, at any barrier.
    (Seen(None, Missing.NONE), DEADLINE + 0.01, False, Next.RECHECK),
    (Seen(None, Missing.NONE), DEADLINE + 0.01, True, Next.RECHECK),
    # Missing ranks at work count only where the meeting waits for work.
    (Seen(None, Missing.AT_WORK), DEADLINE + 0.01, False, Next.GIVE_UP),
    (Seen(None, Missing.AT_WORK), DEADLINE + 0.01, True, Next.RECHECK),
    (Seen(None, Missing.AWAY), DEADLINE + 0.01, True, Next.GIVE_UP),
    (Seen(None, Missing.AWAY), DEADLINE + 0.01, False, Next.GIVE_UP),
    # What was read of the missing ranks does not matter before the deadline.
    (Seen(None, Missing.AWAY), T0, True, Next.WAIT),
    (Seen(None, Missing.NONE), T0, False, Next.WAIT),
])
def test_a_waiting_rank_acts_on_the_state_and_the_clock(seen, now, waits_for_work, next_):
    assert meeting.waiting(seen, now, DEADLINE, waits_for_work) is next_


def test_a_rank_at_work_keeps_the_wait_going_one_recheck_at_a_time():
    """The executor's loop on a fixed clock: the deadline moves while every missing rank works, then gives up."""
    deadline, now, actions = DEADLINE, T0, []
    at_work = [Missing.AT_WORK, Missing.NONE, Missing.AWAY]  # what the missing ranks do at each look past it
    while True:
        now += 0.5
        step = meeting.waiting(Seen(None), now, deadline, waits_for_work=True)
        if step is Next.READ_MISSING:
            step = meeting.waiting(Seen(None, at_work.pop(0)), now, deadline, waits_for_work=True)
        actions.append(step)
        if step is Next.RECHECK:
            deadline = now + 1.0
        elif step is not Next.WAIT:
            break
    assert [a for a in actions if a is not Next.WAIT] == [Next.RECHECK, Next.RECHECK, Next.GIVE_UP]
    # The first look one slice past the deadline, each next one a slice past its recheck's second.
    assert now == pytest.approx(DEADLINE + 0.5 + 2 * (1.0 + 0.5))


@pytest.mark.parametrize(("cause", "found", "leave"), [
    # The close found its own words, or a refusal (or the store was gone): the wait ends with what ended it.
    *[(cause, found, Leave.RAISE) for cause in Cause for found in (CLOSED, REFUSED, None)],
    # It opened just before: the others go on, and so does a rank that merely ran out of time.
    (Cause.DEADLINE, GO, Leave.GO_ON),
    (Cause.DEADLINE, REBUILD, Leave.GO_ON),
    (Cause.STOP, GO, Leave.STOPPED_AFTER_OPEN),
    (Cause.STOP, REBUILD, Leave.STOPPED_AFTER_OPEN),
    (Cause.ERROR, GO, Leave.RAISE_OPENED),
])
def test_a_rank_that_closes_the_meeting_leaves_by_what_the_close_found(cause, found, leave):
    assert meeting.leaving(cause, found) is leave


@pytest.mark.parametrize(("leave", "notes"), [
    (Leave.RAISE, True), (Leave.GO_ON, False), (Leave.STOPPED_AFTER_OPEN, False), (Leave.RAISE_OPENED, False),
])
def test_only_a_rank_whose_meeting_stayed_closed_notes_that_it_stopped_waiting(leave, notes):
    assert meeting.notes_gave_up(leave) is notes
