"""What a rank at a meeting of the ranks does next: pure decisions over what it read and the clock.

A meeting (:func:`nbdist.world.gather.barrier`) is a count of arrivals and a state key. Its
executor, the barrier, reads the store, asks these functions what to do, and alone writes; nothing
here touches the store or the clock, so every decision is tested as a table (``tests/world/test_meeting.py``)::

    arrive --count < expected--> WAIT --state set--> OPENED | REFUSED | CLOSED
       |                           |
       +--count >= expected--> DECIDE (the last to arrive writes the verdict)
                                   |
                                   +--past the deadline--> READ_MISSING --none missing--> RECHECK (a new deadline)
                                                                         |--all at work--> RECHECK
                                                                         +--otherwise--> GIVE_UP

"None missing": every rank's note says it reached this meeting, and the state is not yet decided: the last to arrive
is counting itself in or deciding, so a rank past its deadline waits on (a rank held up there, by a loaded machine,
between its note and its verdict, is no rank missing; its heartbeat vouches for its life, and a rank that leaves
the meeting on its own closes it).

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


class Missing(enum.Enum):
    """What a rank past its deadline read of the ranks whose notes do not say they reached the meeting."""

    NONE = "none"  # every rank's note says it is there: the last to arrive is deciding
    AT_WORK = "at work"  # every rank still missing works towards the meeting (running the cell's body)
    AWAY = "away"  # some rank still missing does something else, or nothing


@dataclass(frozen=True)
class Seen:
    """What a waiting rank read in one slice: the meeting's state (None: undecided), and, once asked for
    (:attr:`Next.READ_MISSING`), what the missing ranks do (None: not read)."""

    state: Verdict | None
    missing: Missing | None = None


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

    Past the deadline, the rank looks at the missing ranks first, and waits on while none is missing (the last
    to arrive is deciding). ``waits_for_work``: the meeting's deadline does not count for a missing rank still
    at work towards it (running the cell's body) either: the rank waits on while every missing rank works.
    Their heartbeats vouch for their lives: a dead one ends the wait by another check.
    """
    if seen.state is not None:
        return decided(seen.state)
    if now <= deadline:
        return Next.WAIT
    if seen.missing is None:
        return Next.READ_MISSING
    if seen.missing is Missing.NONE or (seen.missing is Missing.AT_WORK and waits_for_work):
        return Next.RECHECK
    return Next.GIVE_UP


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
