"""One driver for every kind of step: the ceremony in one place, what differs as a plan.

A ``%%collective``, a ``%dist_barrier`` and a plain cell's rebuild of the process group are each a step of the
world (:mod:`nbdist.cell.turn`), and each goes through the same ceremony: take the step's number, hold the stop
button while nbdist's own part runs, meet the others, build the process group where every rank must, run what
the step runs, meet at its end, and, whatever ends it early, end the turn closed so that no rank waits for this
one. :func:`drive` is that ceremony; a caller hands it a :class:`Plan`, what its kind of step does.

As torch elastic's rendezvous does (``dynamic_rendezvous.py``: state, actions, one executor loop), a pure
function decides the next action from the turn's phase (:func:`next_action`), and one loop carries it out::

    phase     CLAIMED  MEETING                BUILDING       BODY  DONE (its end met)
    action    MEET     BUILD | BODY | FINISH  BODY | FINISH  END   FINISH

A stop that lands once every rank has arrived at the meeting belongs to what follows (the others go on): it is
held, and taken as the body starts (a cell: its body is stopped), once the group is built (a plain cell's
rebuild: the plain cell stops), or not at all (a barrier: nothing is left to stop).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..errors import TurnError
from ..world.link import sync_generation
from ..world.verdict import Verdict
from ..world.world import World
from .turn import Ending, Meeting, Phase, Turn

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Action(enum.Enum):
    MEET = "meet"  # arrive at the step's meeting and wait until it is decided
    BUILD = "build"  # build the process group, as every rank does
    BODY = "body"  # run what the step runs (a cell's body)
    END = "end"  # publish, and meet the others at the step's end
    FINISH = "finish"  # the step is over on this rank


class Build(enum.Enum):
    """When a kind of step builds the process group once its meeting opens."""

    NEVER = "never"  # a %dist_barrier
    ASKED = "asked"  # a %%collective: when the last to arrive says so (a rank cannot trust its group)
    ALWAYS = "always"  # a plain cell's rebuild: that is the step


@dataclass(frozen=True)
class Shape:
    """What a kind of step has, for :func:`next_action`: when it builds, and whether it runs a body (and so meets
    again at its end)."""

    build: Build
    runs: bool


BARRIER = Shape(Build.NEVER, runs=False)
REBUILD = Shape(Build.ALWAYS, runs=False)
CELL = Shape(Build.ASKED, runs=True)


def next_action(phase: Phase, shape: Shape, opened: Verdict | None) -> Action:
    """What this rank does next at a step of ``shape``, in ``phase``; ``opened``: the verdict its meeting opened
    with (None before it did)."""
    if phase is Phase.CLAIMED:
        return Action.MEET
    if phase is Phase.MEETING and opened is not None and (
            shape.build is Build.ALWAYS or (shape.build is Build.ASKED and opened.rebuild is not None)):
        return Action.BUILD
    if phase in (Phase.MEETING, Phase.BUILDING) and opened is not None:
        return Action.BODY if shape.runs else Action.FINISH
    if phase is Phase.BODY:
        return Action.END
    if phase is Phase.DONE:
        return Action.FINISH
    raise TurnError(f"nbdist's step driver has no action for a turn {phase.value}"
                    f"{'' if opened is None else ' (met: ' + opened.encode() + ')'}: this is a bug in nbdist, "
                    "please report it")


@dataclass(frozen=True)
class Claim:
    """How a step takes its number, inside the driver's guard (a stop there closes the step): the driver's step
    that a follower runs (``step``), this notebook's own step handed to its followers with its number
    (``publish``: :meth:`Turn.starts`), or else the world's next. ``sync``: follow the world to the store's
    generation first."""

    step: int | None = None
    publish: Callable[[int], None] | None = None
    sync: bool = False


class Work(Protocol[R_co]):
    """What a step with a body runs (a ``%%collective``): its body, what it publishes and meets at its end, and
    what it returns once that meeting opened."""

    def body(self, opened: Verdict) -> None: ...

    def end(self) -> Ending: ...

    def ended(self, opened: Verdict) -> R_co: ...


@dataclass(frozen=True)
class Plan(Generic[R]):
    """What one kind of step does, for :func:`drive`.

    ``meeting(step)``: what its meeting at that step is; ``closes``: the text a rank that leaves before it was
    counted in closes the step with (its body, or :data:`nbdist.cell.turn.BARRIER`; see :meth:`Turn.abort`);
    ``claim``: how it takes its number (None: the turn claimed it already, a ``%%collective`` as its cell
    began); ``build(step)``: how this rank builds the group; ``work``: the body and the end, for a step that
    runs one; ``stops_after``: a stop held to the step's end stops what follows (a plain cell's rebuild), else
    it is dropped (nothing is left to stop)."""

    shape: Shape
    meeting: Callable[[int], Meeting]
    closes: str | None
    claim: Claim | None = None
    build: Callable[[int], None] | None = None
    work: Work[R] | None = None
    stops_after: bool = False


def drive(turn: Turn, world: World, plan: Plan[R]) -> R | None:
    """Run one step of ``plan`` on this rank, as its turn (see the module docstring); what its work returns (None
    for a step without a body). Whatever ends it early ends the turn, closed (:meth:`Turn.guarded`)."""
    result: R | None = None
    try:
        with turn.guarded(world, plan.closes), turn.stops.held(take=False):
            if plan.claim is not None:
                _claim(turn, world, plan)
            result = _run(turn, world, plan)
    finally:
        turn.stops.drop()  # what was held and not taken came as the step ended: nothing is left to stop
    return result


def _run(turn: Turn, world: World, plan: Plan[R]) -> R | None:
    """The executor loop (see the module docstring)."""
    result: R | None = None
    opened: Verdict | None = None
    while (action := next_action(turn.phase, plan.shape, opened)) is not Action.FINISH:
        if action is Action.MEET:
            assert turn.step is not None
            opened = turn.meet(world, plan.meeting(turn.step))  # a stop kept there stops what follows (above)
        elif action is Action.BUILD:
            turn.enter(Phase.BUILDING)  # every rank arrived, and builds: so does this one, whatever it holds
            assert plan.build is not None and turn.step is not None, "a step that builds says how"
            plan.build(turn.step)
        elif action is Action.BODY:
            assert plan.work is not None and opened is not None
            turn.enter(Phase.BODY)
            plan.work.body(opened)
        else:
            assert plan.work is not None
            turn.enter(Phase.ENDING)
            result = plan.work.ended(turn.meet_end(world, plan.work.end()))
    if turn.phase is not Phase.DONE:
        turn.done()
    if plan.stops_after:
        turn.stops.check()
    return result


def _claim(turn: Turn, world: World, plan: Plan[R]) -> None:
    claim = plan.claim
    assert claim is not None
    if claim.sync:
        sync_generation(world)
    if claim.step is not None:
        turn.follows(claim.step)
    elif claim.publish is not None:
        assert plan.closes is not None
        turn.starts(world, plan.closes, claim.publish)
    else:
        turn.claim(world.turns.next())
