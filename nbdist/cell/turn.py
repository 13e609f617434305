"""One rank's turn at a step: its phases, and how a step ends early.

Every ``%%collective``, ``%dist_barrier`` and rebuild of the process group is a numbered step of
the world (:mod:`nbdist.world.counters`). One rank's part in a step goes through these phases::

    IDLE --claim--> CLAIMED --> ARRIVING --counted--> MEETING --opened--> [BUILDING] --> BODY --> ENDING --> DONE
                       |            |                    |                    |           |         |
                       +------------+--------------------+--------------------+-----------+---------+--abort--> DONE

    (a %dist_barrier's step ends at MEETING, a plain cell's rebuild at BUILDING; DONE --claim--> CLAIMED: a
    follower's next step in the same cell)

:class:`Turn` refuses a move the diagram does not have (:data:`EDGES`) with :class:`~nbdist.errors.TurnError`.
One driver, :func:`nbdist.cell.step.drive`, makes the moves for every kind of step; the turn's own methods
make the rest (the claim as a cell begins, the count at the meeting, the early end).

- ``CLAIMED``: the rank read the step's number (at IPython's ``pre_run_cell`` for a ``%%collective``)
  and has not arrived at its meeting;
- ``ARRIVING``: it records itself at the step's meeting (``t/<n>/in``), not yet counted in;
- ``MEETING``: it is counted in, and waits for the others (or decides, as the last to arrive);
- ``BUILDING``: the meeting opened with a rebuild, and the rank builds the process group;
- ``BODY``: the body runs (or, outside ``--ranks``, is skipped);
- ``ENDING``: the rank publishes its output and meets the others at the end (``t/<n>/out``).

:meth:`Turn.abort` is the one place where a rank's step ends early, whatever ended it (the stop
button, a typo in the magic's flags, an error of nbdist's own); what it writes depends only on the
phase (:func:`closing`): a rank stopped before it was counted in closes the step with a hash of the cell's
body, so a rank late to the same cell fails at once with its reason instead of waiting at the next step
(:func:`refuse_if_peer_did_not_start`); a follower that refuses a driven cell closes the step the cell was
sent for in the same way (:func:`refuse_sent`). While nbdist's own part of a step runs, the stop button is *held*
(:class:`~nbdist.cell.stops.Stops`): a press is recorded, and taken where the turn can act on it, never between
two store calls: at the meeting's wait (which closes the meeting), before the body (the body ends
interrupted, and the others are told) or at the end's wait. A rebuild that every rank started is
finished first: stopping one rank inside it would leave the others waiting in torch's set-up.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import (
    CellMismatchError,
    DriveError,
    NbdistError,
    PeerFailedError,
    StoreConnectionError,
    TurnError,
    WaitTimeout,
)
from ..world import gather, keys, records
from ..world.gather import BarrierRefused, Gathering
from ..world.records import Note
from ..world.verdict import Verdict
from ..world.world import World, step_name
from .stops import Stops
from .watch import publish

log = logging.getLogger(__name__)

BARRIER = "%dist_barrier"  # what names a %dist_barrier's step across ranks, as a body names a cell's


class Phase(enum.Enum):
    IDLE = "idle"
    CLAIMED = "claimed"
    ARRIVING = "arriving"
    MEETING = "meeting"
    BUILDING = "building"
    BODY = "body"
    ENDING = "ending"
    DONE = "done"


# The moves of the module's diagram; every phase may also end, to DONE (an early end: :meth:`Turn.abort`).
EDGES: frozenset[tuple[Phase, Phase]] = frozenset({
    (Phase.IDLE, Phase.CLAIMED), (Phase.CLAIMED, Phase.CLAIMED), (Phase.DONE, Phase.CLAIMED),
    (Phase.CLAIMED, Phase.ARRIVING), (Phase.ARRIVING, Phase.MEETING),
    (Phase.MEETING, Phase.BUILDING), (Phase.MEETING, Phase.BODY), (Phase.BUILDING, Phase.BODY),
    (Phase.BODY, Phase.ENDING),
    *((phase, Phase.DONE) for phase in Phase),
})


@dataclass(frozen=True)
class Meeting:
    """What a step's meeting is, for :meth:`Turn.meet` (see :func:`nbdist.world.gather.meet`).

    ``kind`` ("cell", "barrier", "rebuild") and ``label`` name the step across ranks; ``cell``: what a
    ``%%collective`` runs with; ``verdict``: what the last to arrive decides (go without one); ``working``: whether
    a missing rank still works towards the step; ``hint``: added to a wait that ran out, what it waited for."""

    kind: str
    label: str
    timeout: float
    cell: records.CellStart | None = None
    verdict: Callable[[list[records.Arrival]], Verdict] | None = None
    working: Callable[[int, Note | None], bool] | None = None
    on_tick: Callable[[], None] | None = None
    on_missed: Callable[[str], None] | None = None
    hint: str | None = None


@dataclass(frozen=True)
class Ending:
    """A step's meeting at its end (a cell's ``t/<n>/out``), for :meth:`Turn.meet_end`; ``failed`` is told what
    ended the wait early, before it is raised."""

    gathering: Gathering
    failed: Callable[[BaseException], None] | None = None


@dataclass(frozen=True)
class Closing:
    """What a rank that leaves its step early writes: the step's meeting and end are closed and its failure
    published; ``unstarted``: with the body's hash, so that a rank late to the same cell fails at once
    rather than wait at the next step (:func:`refuse_if_peer_did_not_start`)."""

    unstarted: bool


def closing(phase: Phase) -> Closing | None:
    """What a rank leaving its step in ``phase`` must write; None when there is nothing to close."""
    if phase in (Phase.IDLE, Phase.DONE):
        return None
    # Never counted in at its meeting: the same cell, run late elsewhere, must not wait for this one. (One that was
    # counted in and gave up waiting is met by a late rank at the next step, with a line saying so.)
    return Closing(unstarted=phase in (Phase.CLAIMED, Phase.ARRIVING))


def takes_stop(phase: Phase) -> bool:
    """Whether a held press of the stop button is acted on as the step enters ``phase``.

    Never inside a rebuild that every rank started, and not as the body ends: there the end's wait
    takes it while it waits for others (once every rank has ended, it has nothing left to stop).
    """
    return phase not in (Phase.BUILDING, Phase.ENDING, Phase.DONE)


@dataclass(frozen=True)
class CellEnded:
    """IPython's ``post_run_cell``, as the turn sees it: whether the cell was a ``%%collective``, what it raised
    (None: nothing), and its body (the cell's text after the magic's line)."""

    collective: bool
    error: BaseException | None
    body: str

    @classmethod
    def of(cls, raw: str, error: BaseException | None) -> CellEnded:
        return cls(is_collective(raw), error, raw.lstrip().partition("\n")[2])


def is_collective(raw: str) -> bool:
    """Whether a cell's text is a ``%%collective`` (which claims its step as it begins)."""
    return raw.lstrip().startswith("%%collective")


@dataclass(frozen=True)
class Leaving:
    """What a cell that ended with an error leaves its step with (:meth:`Turn.abort`): the reason the others read."""

    reason: str
    interrupted: bool
    body: str


def left_early(event: CellEnded) -> Leaving | None:
    """What a ``%%collective`` that ended with an error must still tell the others, if anything.

    The stop button, or the magic's flags, can end it before nbdist's code ran (the turn is then ``CLAIMED``
    and :func:`closing` closes the step); an error inside nbdist's code has already ended the turn (``DONE``:
    nothing to write). A cell refused because another notebook drives had no turn of its own.
    """
    if not event.collective or event.error is None or isinstance(event.error, DriveError):
        return None
    interrupted = isinstance(event.error, KeyboardInterrupt)
    reason = ("interrupted its cell" if interrupted
              else f"could not start its cell ({type(event.error).__name__}: {event.error})")
    return Leaving(reason, interrupted, event.body)


class Turn:
    """One rank's turn at the step its running cell takes (one per kernel; see the module docstring)."""

    def __init__(self, stops: Stops | None = None) -> None:
        self.phase = Phase.IDLE
        self.step: int | None = None
        self.stops = Stops() if stops is None else stops  # one per kernel: its turns share it

    def _move(self, phase: Phase) -> None:
        if (self.phase, phase) not in EDGES:
            raise TurnError(f"nbdist's turn cannot go from {self.phase.value} to {phase.value} (step "
                            f"#{self.step}): this is a bug in nbdist, please report it")
        self.phase = phase

    def begin(self) -> None:
        """A cell of the user's starts: no step yet (a new turn, whatever the last one left)."""
        self.phase, self.step = Phase.IDLE, None

    def claim(self, step: int) -> None:
        self._move(Phase.CLAIMED)
        self.step = step

    def enter(self, phase: Phase) -> None:
        """The step moves on to ``phase`` (a held press is taken here unless the phase holds it)."""
        self._move(phase)
        if takes_stop(phase):
            self.stops.check()

    def done(self) -> None:
        self._move(Phase.DONE)

    def meet(self, world: World, meeting: Meeting) -> Verdict:
        """Meet the others at this turn's step (:func:`nbdist.world.gather.meet`), taking held presses where
        the turn must: the verdict it opened with. A stop that came once every rank had arrived is kept for what
        follows (:meth:`Stops.keep`: the caller goes as far as every rank must, a rebuild, then takes it). A
        refusal is a CellMismatchError."""
        assert self.step is not None, "the turn claims its step first"
        self.enter(Phase.ARRIVING)
        def tick() -> None:
            self.stops.check()
            if meeting.on_tick is not None:
                meeting.on_tick()

        try:
            arrival = records.Arrival(meeting.kind, meeting.label, meeting.cell)
            return gather.meet(world, self.step, arrival, meeting.timeout, verdict=meeting.verdict, on_tick=tick,
                               working=meeting.working, on_missed=meeting.on_missed, on_arrive=self.arrived,
                               on_late_stop=self.stops.keep)
        except BarrierRefused as exc:
            self.done()  # every rank was refused alike: nothing to close
            raise CellMismatchError(str(exc)) from None
        except WaitTimeout as exc:
            if meeting.hint is None:
                raise
            raise WaitTimeout(f"{exc}. {meeting.hint}") from None

    def meet_end(self, world: World, ending: Ending) -> Verdict:
        """Meet the others at the end of this turn's step (:func:`nbdist.world.gather.barrier`); once it opens the
        step has ended on every rank. Whatever ends the wait early is told to ``ending.failed`` first."""
        assert self.phase is Phase.ENDING, "the step's end is met from its body"
        try:
            opened = gather.barrier(world, ending.gathering)
        except (NbdistError, KeyboardInterrupt) as exc:
            if ending.failed is not None:
                ending.failed(exc)
            raise
        self.done()
        return opened

    def compare(self, world: World, gathering: Gathering) -> Verdict:
        """A meeting inside this turn's body: a collective's comparison across the ranks
        (:meth:`nbdist.cell.fingerprint.Checker.agree`), met only while the body runs."""
        if self.phase is not Phase.BODY:
            raise TurnError(f"nbdist compared a collective across the ranks outside a cell's body (step #{self.step}, "
                            f"{self.phase.value}): this is a bug in nbdist, please report it")
        return gather.barrier(world, gathering)

    @contextlib.contextmanager
    def guarded(self, world: World, body: str | None) -> Iterator[None]:
        """Whatever ends the block early ends this turn (:meth:`abort`), so no rank waits for this one."""
        try:
            yield
        except StoreConnectionError:
            self.done()
            raise  # nobody can be told
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            try:
                self.abort(world, "interrupted its cell" if interrupted else f"stopped: {exc}", interrupted, body)
            except StoreConnectionError as lost:
                exc.add_note(f"(the other ranks could not be told: {lost})")
            raise

    def cell_began(self, world: World | None, raw: str) -> None:
        """IPython's ``pre_run_cell``: a cell of the user's begins; a ``%%collective`` claims the world's next step
        now, so that a rank whose same cell fails before nbdist's code (a typo in its flags) closes that step, and
        this rank, arriving after, fails at once with the reason instead of waiting at the step after it."""
        self.begin()
        if world is None or not is_collective(raw):
            return
        try:
            self.claim(world.turns.next())
        except StoreConnectionError:  # the cell itself will say so
            return

    def starts(self, world: World, body: str, publish: Callable[[int], None]) -> int:
        """This notebook's own ``%%collective`` (``body``: its source) or ``%dist_barrier`` (:data:`BARRIER`) reaches
        nbdist's code: its step is the one ``pre_run_cell`` claimed (:meth:`cell_began`), else the world's next. A
        peer that could not start this same cell or barrier at that step fails it at once, with its reason, taking
        no step (:func:`refuse_if_peer_did_not_start`); otherwise ``publish(step)`` hands it to this notebook's
        followers, a stop held until it is out whole. Returns the step."""
        if self.phase not in (Phase.IDLE, Phase.CLAIMED, Phase.DONE):  # the kernel's turn is at another's step
            raise TurnError(f"a %%collective cannot run inside another %%collective's body (step #{self.step}, "
                            f"{self.phase.value}): run it as a cell of its own, or as plain code in the body")
        step = self.step if self.phase is Phase.CLAIMED and self.step is not None else world.turns.next()
        self.claim(step)
        try:
            refuse_if_peer_did_not_start(world, step, body)
        except PeerFailedError:
            self.done()  # it decided at its start: no step of its own to close (cell_ended)
            raise
        with self.stops.held():  # a press as it is published is taken once it is, whole
            publish(step)
        return step

    def follows(self, step: int) -> None:
        """A followed ``%%collective`` or ``%dist_barrier`` (its driver's) reaches nbdist's code: the driver's step."""
        self.claim(step)

    def cell_ended(self, world: World, event: CellEnded, catch_up: Callable[[], object]) -> None:
        """IPython's ``post_run_cell``: a ``%%collective`` stopped before its turn still takes it, closed
        (:func:`left_early`); without this the other ranks would wait for this one until their --timeout.

        ``catch_up`` brings the world to the store's generation first. A second press must not cut this short
        (IPython's event loop would swallow it, and nobody be told): the stop button is held while it writes.
        """
        leaving = left_early(event)
        if leaving is None:
            return
        with self.stops.held(take=False):
            try:
                catch_up()
                if self.step is None:  # the step could not be read as the cell began: the world's next one
                    self.claim(world.turns.next())
                self.abort(world, leaving.reason, leaving.interrupted, leaving.body)
            except StoreConnectionError as exc:
                log.info("could not tell the others this rank's cell did not start: %s", exc)
        self.stops.drop()

    def arrived(self) -> None:
        """This rank is counted in at the step's meeting next (:func:`nbdist.world.gather.meet`). A press held
        while it recorded itself there is taken first, as a stop before it was counted in: it leaves the meeting
        to :meth:`abort`, which tells a late rank before anyone can see the step closed."""
        if self.phase is Phase.ARRIVING:
            self.stops.check()
            self._move(Phase.MEETING)

    def abort(self, world: World, reason: str, interrupted: bool, body: str | None) -> None:
        """This rank's step ends early: close what its phase left open (see :func:`closing`); idempotent.

        The stop button is held while it writes: a second press must not cut the closing short and leave
        the others waiting for this rank.
        """
        what = closing(self.phase)
        step, self.phase = self.step, Phase.DONE
        if what is None or step is None:
            return
        with self.stops.held(take=False):
            close(world, step, reason, interrupted, body if what.unstarted else None)
        if not self.stops.holding:
            self.stops.drop()  # the stop that ended the step is the one being raised


def body_digest(body: str) -> str:
    """What names a %%collective's body across ranks, whatever its flags (see :func:`refuse_if_peer_did_not_start`)."""
    return hashlib.sha256(body.strip().encode()).hexdigest()


def close(world: World, step: int, reason: str, interrupted: bool = False, body: str | None = None) -> None:
    """End this rank's part in the cell of ``step`` early: the others stop waiting for it, with ``reason``.

    ``body``: the cell's body, when the cell never reached the protocol (a rank late to the same cell
    then fails with ``reason`` rather than wait at the next step; see :func:`refuse_if_peer_did_not_start`).
    """
    cell = step_name(step)
    publish(world.client, world, cell, records.Failure(
        world.rank, "interrupted" if interrupted else "error", f"{world.describe(world.rank)} {reason}",
        None if body is None else body_digest(body)))
    gather.close_step(world, step, reason)
    gather.close(world, keys.ending(cell), reason)


def abandon(world: World, reason: str, interrupted: bool = False, body: str | None = None) -> None:
    """A %%collective that failed before it reached the protocol still takes its turn, closed, so none waits."""
    close(world, world.turns.next(), reason, interrupted, body)


def refuse_sent(world: World, step: object, reason: str) -> None:
    """A follower refuses a driven cell sent for ``step``: the driver, waiting at that step's meeting, is told.

    The message did not verify, so its number is anyone's word: only the step the world is at is closed
    (the one a genuine driver waits at), never one it has passed or one still to come. The step is closed as
    any rank's that never arrived (:meth:`Turn.abort` from ``CLAIMED``): this one turn, nothing else.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step != world.turns.next():
        return
    refusal = Turn()
    refusal.claim(step)
    refusal.abort(world, reason, interrupted=False, body=None)


@dataclass(frozen=True)
class LateStart:
    """What a rank reads as its cell reaches step ``n`` when step ``n - 1`` went by without it: that step's first
    ``failure`` (None: none, or not a failure), and whether any rank ``waits`` at step ``n``'s meeting."""

    failure: records.Failure | None
    waits: bool


def late_refusal(seen: LateStart, me: int, digest: str) -> records.Failure | None:
    """The failure that refuses this rank's cell (``digest``: its body's, :func:`body_digest`) at its start, or
    None (it goes on to meet the others at ``n``): another rank's same cell or barrier never started and closed
    step ``n - 1``, and nobody has come to step ``n`` since (a rank that ran its cell again waits there)."""
    failure = seen.failure
    if failure is None or failure.rank == me or failure.unstarted != digest or seen.waits:
        return None
    return failure


def refuse_if_peer_did_not_start(world: World, n: int, source: str) -> None:
    """Fail at once when another rank's same cell could not start, and closed its step before this rank read ``n``.

    A rank whose ``%%collective`` fails before nbdist's code (a typo in its flags, a stop) closes the
    step it took, and the world moves on. A rank that runs the same cell a moment later reads the
    next step, ``n``, and would wait there for the other until its --timeout. So: if this rank missed
    step ``n - 1``, that step was closed by another rank's cell with this body that never started,
    and nobody has come to step ``n`` yet, this cell fails with that rank's reason and takes no step.
    A rank that has since run its cell again is waiting at ``n``: then this one meets it there. It is told
    once: run again before the other rank has, its cell goes to meet it at ``n``.
    """
    if world.last_turn is None or n - 1 <= world.last_turn:
        return  # it met step n - 1, or it has just joined: nothing went by without it
    failure = records.Failure.read(world.client.get_if(world.key(keys.failed(step_name(n - 1)))))
    arrived = world.client.get_if(world.key(keys.arrivals(keys.arrival(n)))) if failure is not None else None
    failure = late_refusal(LateStart(failure, arrived not in (None, "0")), world.rank, body_digest(source))
    if failure is None:
        return
    label = f"%dist_barrier #{n - 1}" if source == BARRIER else f"%%collective #{n - 1} (start)"
    world.last_turn = n - 1  # told once: its next cell meets the others at ``n``, however soon it runs
    raise PeerFailedError(f"{label}: {failure.message}; run the next cell on every rank")
