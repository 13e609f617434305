"""The meeting executor: every rank meets at a barrier, and the last to arrive decides for all.

A barrier (a :class:`Gathering`) is a count of arrivals and a state key in the store (``keys.arrivals`` and
``keys.state`` under its name). Each rank notes that it waits, counts itself in, and either decides, as the last
to arrive, or waits until the state is decided; :mod:`nbdist.world.meeting` makes each of these decisions from
frozen facts, and :mod:`nbdist.world.verdict` is the state's one codec. A rank that stops waiting (a timeout, a
stop, a lost peer) closes the barrier with its reason, so the ranks still waiting fail with that reason and a late
one fails at once. A step's meeting (:func:`meet`) is such a barrier, ``t/<n>/in``, whose opening or closing also
takes the world's turn ``n`` (:meth:`nbdist.world.counters.Turns.take`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import PeerFailedError, PeerLostError, StoreConnectionError, WaitTimeout
from ..ranksets import who_said
from . import keys, meeting
from . import verdict as verdicts
from .meeting import Cause, Leave, Missing, Next, Seen
from .records import Arrival, MalformedRecord, Note
from .verdict import Verdict
from .world import World, step_name

WORKING_RECHECK = 1.0  # seconds between looks, past the deadline, at whether the ranks a barrier waits for are missing
UNBOUNDED = 10.0**7  # seconds: a wait whose deadline its tick keeps


class BarrierRefused(Exception):
    """The last rank to arrive refused to open a barrier; the message says why (see ``verdict``)."""


@dataclass(frozen=True)
class Gathering:
    """One barrier, as data: its ``name`` under the round, its ``label`` for people, and how long it waits.

    ``verdict``: what the last rank to arrive decides (go without one); ``members``: the ranks that meet (None:
    every rank); ``working(rank, last)``: from a missing rank's last note, whether it still works towards this
    barrier (running the cell's body, say): ``timeout`` does not count for such a rank while its heartbeat lives;
    ``on_tick``: the caller's check in every slice of the wait; ``then``: what this rank's note reads as once the
    barrier opened (:meth:`.notes.Notes.last`), "passed LABEL" if not given; ``step``: the barrier is step
    ``step``'s meeting (:func:`meet`): opening or closing it takes that turn; ``late_stop``: where a stop that lands
    once every rank arrived goes, the others going on (the turn keeps it for what follows the meeting: a rebuild
    that every rank started must finish first); without it, it is raised as it came.
    """

    name: str
    label: str
    timeout: float
    verdict: Callable[[], Verdict] | None = None
    members: list[int] | None = None
    working: Callable[[int, Note | None], bool] | None = None
    on_tick: Callable[[], None] | None = None
    then: str | None = None
    step: int | None = None
    late_stop: Callable[[KeyboardInterrupt], None] | None = None


def missed(world: World, n: int) -> str | None:
    """What the steps between this rank's last one and ``n`` were, if it missed any (they were closed)."""
    if world.last_turn is None or n <= world.last_turn + 1:
        return None
    first, last = world.last_turn + 1, n - 1
    decided = verdicts.decode(world.client.get_if(world.key(keys.state(keys.arrival(last)))))
    why = decided.said if decided is not None else "closed"
    steps = f"step #{first}" if first == last else f"steps #{first}-#{last}"
    return (f"{steps} went by without this rank (the last: {why}); it meets the others at step #{n}, which "
            "every rank reaches next")


def meet(world: World, n: int, arrival: Arrival, timeout: float,
         verdict: Callable[[list[Arrival]], Verdict] | None = None,
         on_tick: Callable[[], None] | None = None,
         working: Callable[[int, Note | None], bool] | None = None,
         on_missed: Callable[[str], None] | None = None,
         on_arrive: Callable[[], None] | None = None,
         on_late_stop: Callable[[KeyboardInterrupt], None] | None = None) -> Verdict:
    """Meet every rank at step ``n``; returns the verdict it opened with (see :func:`barrier`).

    ``arrival`` says what step this rank reached (its kind: "cell", "barrier", "rebuild", and its label):
    ranks that reach different kinds of step ran different cells, and are refused alike, each named
    with its label. Where the kinds agree, ``verdict`` decides from every rank's arrival (in rank order),
    as the last rank to arrive reads them. ``on_missed`` is told, before the wait, of steps the world
    took without this rank (see :func:`missed`); ``on_arrive``, once its record is in and just before
    it is counted in (it may raise: then nothing closes the meeting here, and the caller does);
    ``on_late_stop``: where a stop that lands once every rank arrived goes (:attr:`Gathering.late_stop`).
    """
    name = step_name(n)
    went_by = missed(world, n)
    if went_by is not None and on_missed is not None:
        on_missed(went_by)
    world.last_turn = n
    world.client.set(world.key(keys.record(name, world.rank)), arrival.to_json())

    def decide() -> Verdict:
        texts = world.client.multi_get([world.key(keys.record(name, i)) for i in range(world.world_size)])
        arrivals, malformed = [], dict[str, list[int]]()
        for i, text in enumerate(texts):
            try:
                arrivals.append(Arrival.from_json(text))
            except MalformedRecord as exc:  # anyone who reaches the port can write there
                malformed.setdefault(f"not nbdist's: {exc}", []).append(i)
        if malformed:
            return verdicts.refused(f"the records of this step are not all nbdist's ({who_said(malformed)}); "
                                    "nothing ran. Run the next cell on every rank")
        if len({a.kind for a in arrivals}) > 1:
            steps: dict[str, list[int]] = {}
            for i, a in enumerate(arrivals):
                steps.setdefault(a.label, []).append(i)
            return verdicts.refused(f"the ranks reached different steps ({who_said(steps)}); nothing ran. "
                                    "Run the same cell in every notebook")
        return verdict(arrivals) if verdict is not None else verdicts.GO

    if on_arrive is not None:
        on_arrive()  # this rank is counted in next: what raises here leaves the meeting as it was
    return barrier(world, Gathering(keys.arrival(n), arrival.label, timeout, verdict=decide, working=working,
                                    on_tick=on_tick, step=n, late_stop=on_late_stop))


def barrier(world: World, g: Gathering) -> Verdict:
    """Wait until every rank (or every one of ``g.members``) arrives at ``g``, or fail naming who did not.

    The last rank to arrive decides with ``g.verdict`` (see :mod:`nbdist.world.verdict`): a verdict that opens
    it is every rank's return value (a go may carry what that rank found, for every rank to read with it); a
    refusal makes every rank raise :class:`BarrierRefused` with its reason. A rank that stops waiting (timeout,
    interrupt, a lost peer) closes it with its reason, so the ranks still waiting fail with that reason and a
    late one fails at once.
    """
    base = world.key(g.name)
    expected = world.world_size if g.members is None else len(g.members)
    try:
        # The note comes before the arrival, from every rank: once the barrier opens, every rank's note reads as
        # ``then`` (a status read before its next note), also the note of a rank that arrived just before the
        # last and had not written it yet when the others went on (a 16-rank status met "running" there).
        world.notes.write(f"waiting at {g.label}", barrier=g.name, then=g.then or f"passed {g.label}", turn=g.step)
        if meeting.arrived(world.client.add(keys.arrivals(base), 1), expected) is Next.DECIDE:
            state = _decide(world, base, g)
        else:
            state = _wait_open(world, base, g)
    except KeyboardInterrupt as exc:  # wherever it lands (a store call defers it): nobody may wait for this rank
        user = type(exc) is KeyboardInterrupt
        state = _close(world, base, "interrupted its cell" if user else f"stopped: {exc}", g.step)
        leave = meeting.leaving(Cause.STOP, state)
        if leave is Leave.STOPPED_AFTER_OPEN:
            # Every rank arrived before the stop could close it: they go on, so the stop is what follows'.
            assert state is not None
            if g.late_stop is None:
                raise
            g.late_stop(exc)
            return state
        _note_gave_up(world, g.label, "the stop button" if user else str(exc))
        if user:  # the stop button: its message, not nbdist's frames
            exc._render_traceback_ = lambda: [f"KeyboardInterrupt: stopped waiting at {g.label}; the other "  # type: ignore[attr-defined]
                                              "ranks were told"]
        raise
    if state is None:
        raise PeerFailedError(f"{g.label}: the meeting ended undecided; run the next cell on every rank")
    outcome = meeting.decided(state)
    if outcome is Next.REFUSED:
        raise BarrierRefused(state.why)
    if outcome is Next.CLOSED:
        if state.lost:
            raise PeerLostError(state.why)
        raise PeerFailedError(f"{g.label}: {state.encode()}; run the next cell on every rank")
    return state


def _decide(world: World, base: str, g: Gathering) -> Verdict | None:
    """As the last to arrive, decide for every rank; returns the state (one a rank that left wrote first, if any).
    A verdict that raises closes the meeting with what it raised: every rank's note says it is there, so the
    others wait on for the decision (:class:`nbdist.world.meeting.Missing`) until a state is written."""
    try:
        decided = g.verdict() if g.verdict is not None else verdicts.GO
    except Exception as exc:
        state = _close(world, base, f"could not decide ({type(exc).__name__}: {exc})", g.step)
        if meeting.notes_gave_up(meeting.leaving(Cause.ERROR, state)):
            _note_gave_up(world, g.label, str(exc))
        raise
    if g.step is not None:
        world.turns.take(g.step)
    return verdicts.decode(world.client.compare_set(keys.state(base), "", decided.encode()))


def _wait_open(world: World, base: str, g: Gathering) -> Verdict | None:
    """Wait until the meeting is decided; each slice checks the world, the peers and the caller's tick, and
    :func:`nbdist.world.meeting.waiting` decides what the clock means. Leaving on its own, this rank closes it."""
    deadline = time.monotonic() + g.timeout
    waits_for_work = g.working is not None

    def tick() -> None:
        nonlocal deadline
        world.checks.world()
        world.checks.peers()
        if g.on_tick is not None:
            g.on_tick()
        if world.attend is not None:
            world.attend()
        now = time.monotonic()
        step = meeting.waiting(Seen(None), now, deadline, waits_for_work)
        if step is Next.READ_MISSING:
            step = meeting.waiting(Seen(None, _missing(world, g)), now, deadline, waits_for_work)
        if step is Next.RECHECK:
            deadline = now + WORKING_RECHECK  # none missing, or every missing rank at work: look again soon
        elif step is Next.GIVE_UP:
            raise WaitTimeout(f"waited {g.timeout:g} s")

    try:
        while True:
            world.client.wait([keys.state(base)], UNBOUNDED, on_tick=tick)  # the tick keeps the deadline
            state = verdicts.decode(world.client.get_if(keys.state(base)))
            if state is not None:
                return state
            # Woken with nothing set: torch's TCPStore also wakes a wait when another client's
            # compare-and-set merely reads the missing key. Wait again.
    except WaitTimeout:
        state = _close(world, base, f"gave up waiting after {g.timeout:g} s", g.step)
        if meeting.leaving(Cause.DEADLINE, state) is Leave.GO_ON:
            return state  # it opened as this rank gave up: go on with the others
        missing = who_is_missing(world, g.name, g.timeout, g.label, g.members)
        _note_gave_up(world, g.label, f"waited {g.timeout:g} s")
        raise WaitTimeout(missing) from None
    except Exception as exc:
        lost = str(exc) if isinstance(exc, PeerLostError) else None  # every rank says it as this one found it
        state = _close(world, base, f"stopped waiting: {exc}", g.step, lost)
        if meeting.notes_gave_up(meeting.leaving(Cause.ERROR, state)):
            _note_gave_up(world, g.label, str(exc))
        raise


def _close(world: World, base: str, reason: str, step: int | None = None, lost: str | None = None) -> Verdict | None:
    """Close an open barrier with a reason (taking its ``step``'s turn, if it meets one); returns its verdict
    (one that opened, if it opened meanwhile); None if the store is gone. ``lost``: what this rank found gone
    (:func:`nbdist.world.verdict.lost`), in place of the reason."""
    try:
        if step is not None:
            world.turns.take(step)
        closed = f"{world.describe(world.rank)} {reason}" if lost is None else verdicts.lost(lost).encode()
        return verdicts.decode(world.client.compare_set(keys.state(base), "", closed))
    except StoreConnectionError:  # the store itself is gone: nobody to tell
        return None


def _note_gave_up(world: World, label: str, why: str) -> None:
    """This rank waits at ``label`` no more: its note must not say it still does."""
    try:
        world.notes.write(f"stopped waiting at {label} ({why})")
    except StoreConnectionError:
        return


def close(world: World, name: str, reason: str) -> Verdict | None:
    """Close barrier ``name`` with this rank's reason, whether or not this rank reached it."""
    return _close(world, world.key(name), reason)


def close_step(world: World, n: int, reason: str) -> Verdict | None:
    """Close step ``n``'s meeting with this rank's reason (whether or not it got there); returns its verdict."""
    world.turns.take(n)
    return close(world, keys.arrival(n), reason)


def not_arrived(world: World, name: str, members: list[int] | None) -> dict[int, Note | None]:
    """The last recorded activity of each rank that has not arrived at barrier ``name``."""
    ranks = [i for i in (range(world.world_size) if members is None else members) if i != world.rank]
    return {i: last for i, last in world.notes.of_ranks(ranks).items() if last is None or last.barrier != name}


def _missing(world: World, g: Gathering) -> Missing:
    """What the ranks do that have not noted their arrival at ``g`` (see :class:`Gathering`); the peer checks
    vouch for their lives."""
    missing = not_arrived(world, g.name, g.members)
    if not missing:
        return Missing.NONE
    if g.working is not None and all(g.working(i, last) for i, last in missing.items()):
        return Missing.AT_WORK
    return Missing.AWAY


def who_is_missing(world: World, name: str, timeout: float, label: str, members: list[int] | None = None) -> str:
    """The message of a wait at barrier ``name`` that gave up: every rank that had not arrived, doing what."""
    missing = []
    for i, last in world.notes.of_ranks(list(range(world.world_size) if members is None else members)).items():
        if last is not None and last.barrier == name:
            continue
        missing.append(f"{world.describe(i)}; {world.notes.doing_as(i, last)}")
    who = "; ".join(missing) or "none (they arrived as this rank gave up)"
    return f"{label}: not every rank arrived within {timeout:g} s. Missing: {who}"
