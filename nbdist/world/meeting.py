"""What a rank at a meeting of the ranks does next: pure decisions over what it read and the clock.

A meeting (:func:`nbdist.world.gather.barrier`) is a count of arrivals and a state key. Its
executor, the barrier, reads the store, asks these functions what to do, and alone writes; nothing
here touches the store or the clock, so every decision is tested as a table (``tests/world/test_meeting.py``)::

    arrive --count < expected--> WAIT --state set--> OPENED | REFUSED | CLOSED
       |                           |
       +--count >= expected--> DECIDE (the last to arrive writes the verdict)
                                   |
                                   +--past the deadline--> READ_MISSING --all at work--> RECHECK (a new deadline)
                                                                         |
                                                                         +--otherwise--> GIVE_UP

A rank that leaves the wait on its own (the stop button, the deadline, an error: :class:`Cause`) closes the
meeting with its reason, and what the close found decides how it leaves (:func:`leaving`): a meeting that
opened as it left is every rank's, so a rank that gave up goes on with it, and a stop belongs to what follows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .verdict import Kind, Verdict


class Next(enum.Enum):
    """What a rank waiting at a meeting does next."""

    DECIDE = "decide"  # the last to arrive: decide the verdict and write it
    WAIT = "wait"  # nothing decided, the deadline not passed: wait another slice
    OPENED = "opened"  # every rank arrived: go on (after a rebuild, if it says so)
    REFUSED = "refused"  # every rank arrived and the last refused: raise with its reason
    CLOSED = "closed"  # a rank closed it (stopped, gave up, never came): fail with its words
    READ_MISSING = "read missing"  # past the deadline: read whether the missing ranks are still at work
    RECHECK = "recheck"  # past the deadline, but every missing rank is at work: look again later
    GIVE_UP = "give up"  # past the deadline: close the meeting and name who is missing


@dataclass(frozen=True)
class Seen:
    """What a waiting rank read in one slice: the meeting's state (None: undecided), and, once asked for
    (:attr:`Next.READ_MISSING`), whether every rank still missing is at work (None: not read)."""

    state: Verdict | None
    missing_at_work: bool | None = None


def arrived(count: int, expected: int) -> Next:
    """A rank was counted in as the ``count``-th of ``expected``: the last decides, the others wait."""
    return Next.DECIDE if count >= expected else Next.WAIT


def decided(state: Verdict) -> Next:
    """What a decided meeting means for every rank that reads it."""
    if state.opened:
        return Next.OPENED
    return Next.REFUSED if state.kind is Kind.REFUSED else Next.CLOSED


def waiting(seen: Seen, now: float, deadline: float, waits_for_work: bool) -> Next:
    """The next action of a rank waiting at a meeting, at ``now`` (its deadline: ``deadline``).

    ``waits_for_work``: the meeting's deadline does not count for a missing rank still at work towards
    it (running the cell's body); past the deadline, the rank looks, and waits on while every missing
    rank works (their heartbeats vouch for their lives: a dead one ends the wait by another check).
    """
    if seen.state is not None:
        return decided(seen.state)
    if now <= deadline:
        return Next.WAIT
    if not waits_for_work:
        return Next.GIVE_UP
    if seen.missing_at_work is None:
        return Next.READ_MISSING
    return Next.RECHECK if seen.missing_at_work else Next.GIVE_UP


class Cause(enum.Enum):
    """Why a rank leaves a meeting's wait on its own."""

    STOP = "stop"  # the stop button (or nbdist's own stop of the cell)
    DEADLINE = "deadline"  # it waited out its timeout
    ERROR = "error"  # a check or a tick raised: a lost peer, a changed world, another rank's failure


class Leave(enum.Enum):
    """How a rank that closed a meeting on its own leaves it, given what the close found."""

    GO_ON = "go on"  # it opened as this rank gave up: go on with the others
    STOPPED_AFTER_OPEN = "stopped after open"  # every rank had arrived: they go on, and the stop is the step's
    RAISE = "raise"  # raise what ended the wait; the other ranks see the meeting closed with its reason
    RAISE_OPENED = "raise, opened"  # raise it, though the others go on (its own error, not the meeting's)


def leaving(cause: Cause, found: Verdict | None) -> Leave:
    """How a rank leaves after closing the meeting for ``cause``; ``found``: the state its close found (None: the
    store is gone; otherwise its own closing words, or the verdict decided just before)."""
    opened = found is not None and found.opened
    if not opened:
        return Leave.RAISE
    if cause is Cause.STOP:
        return Leave.STOPPED_AFTER_OPEN
    return Leave.GO_ON if cause is Cause.DEADLINE else Leave.RAISE_OPENED


def notes_gave_up(leave: Leave) -> bool:
    """Whether the rank's activity note must say it stopped waiting (not where the meeting opened for all)."""
    return leave is Leave.RAISE
