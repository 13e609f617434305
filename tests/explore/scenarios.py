"""The scenarios: a program every rank runs on its kernel (:mod:`.kernel`), the events on offer, and the checks.

Rank 1 is the odd one out where the ranks differ. Times are virtual: every wait's timeout is the scenario's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from IPython.core.error import UsageError

from nbdist.cell import cells
from nbdist.drive import follow
from nbdist.errors import (
    CellMismatchError,
    PeerFailedError,
    PeerLostError,
    StoppedError,
    WaitTimeout,
    WorldChangedError,
)
from nbdist.ranksets import ranks_text
from nbdist.world import liveness, rendezvous
from nbdist.world import verdict as verdicts
from nbdist.world.verdict import Verdict
from nbdist.world.world import World

from . import groups
from . import invariants as inv
from .explorer import Hooks, Rejoined, Run, Scenario
from .gate import Hung, Killed
from .invariants import Violation
from .kernel import RAISED, SENT, Kernel, kernel, opened
from .scheduler import AFTER, BEFORE, KILL, SENT_AFTER, SENT_BEFORE, STALLED

T = TypeVar("T")
BODY = "x = RANK\n"
NEXT = "y = RANK\n"  # a next cell that differs from the first, where a scenario needs to tell them apart
ODD = 1  # the rank that differs, where the ranks differ


# --- where events land ----------------------------------------------------------------------------------------------


def everywhere(events: str) -> Callable[[int, str, str], str]:
    """``events`` at every gate of every rank."""
    return lambda rank, op, key: events


def before_arriving(rank: int, op: str, key: str) -> str:
    """Rank 1, between taking its step and arriving at its meeting: its record, and just before it counts in."""
    if rank != ODD:
        return ""
    if op == "set" and "/src/" in key:
        return BEFORE + AFTER
    return BEFORE if op == "add" and key.endswith("/in/n") else ""


# --- a. two ranks meet at a step; a stop anywhere -----------------------------------------------------------------


def meet(world: World, h: Hooks) -> str:
    """Every rank runs the same cell; both cells began (``before_cell`` read step 1) before any stop."""
    return kernel(world, h).collective(BODY, start_turn=1)


def check_meet(run: Run) -> None:
    """A stopped rank ends interrupted, or goes on as if it had not been (the stop came after its cell's end, or
    was lost: F4); a rank fails otherwise only promptly and naming another rank the stop did end; no wait runs out;
    the next step works on every rank."""
    _check_stopped(run, KeyboardInterrupt, (PeerFailedError,), "interrupted its cell")
    inv.no_wait_ran_out(run)
    inv.meets_again(run)


def _check_stopped(run: Run, own: type[BaseException], kinds: tuple[type[BaseException], ...], says: str) -> None:
    hit = run.hit()
    ended = [r for r in sorted(hit) if isinstance(run.outcomes[r].error, own)]  # the ranks the event did end
    for rank in sorted(run.outcomes):
        error = run.outcomes[rank].error
        if rank in hit and (isinstance(error, own) or own is Killed):
            inv.ended_with(run, rank, own)  # a killed kernel runs nothing more
            continue
        if error is None:
            continue
        others = [r for r in ended if r != rank]
        if not others:
            raise Violation(f"{run.describe(rank)} failed, though no other rank was stopped: {run.outcomes[rank]}")
        inv.ended_with(run, rank, *kinds)
        named = [r for r in others if run.describe(r) in str(error)]
        inv.names(run, rank, (named or others)[0], says)
        inv.prompt(run, rank, min(e.vt for e in run.events))


def check_meet_kill(run: Run) -> None:
    """The killed rank's kernel is gone; every other rank opens the cell, or fails promptly naming it gone."""
    _check_stopped(run, Killed, (PeerLostError, PeerFailedError), "is gone")
    inv.no_wait_ran_out(run)
    inv.meets_again(run)


@contextlib.contextmanager
def ring_of_one() -> Iterator[None]:
    """Each rank's look reads only the next rank's beat round the ring (:func:`nbdist.world.liveness.looked_at` with
    one watched and none in turn), as in a world of thousands: only the killed rank's predecessor sees it go."""
    saved = liveness.WATCHED, liveness.ROTATED
    liveness.WATCHED, liveness.ROTATED = 1, 0
    try:
        yield
    finally:
        liveness.WATCHED, liveness.ROTATED = saved


def check_meet_kill_ring(run: Run) -> None:
    """As :func:`check_meet_kill`, and every rank that failed raised the ``PeerLostError`` that named the killed rank,
    also those that do not read its heartbeat (the rank that does closes the meeting with what it found)."""
    check_meet_kill(run)
    for rank, outcome in sorted(run.outcomes.items()):
        error = outcome.error
        if error is not None and not isinstance(error, (Killed, PeerLostError)):
            raise Violation(f"{run.describe(rank)} failed with {type(error).__name__}, not the lost peer's "
                            f"PeerLostError: {error}")


def meet_late(world: World, h: Hooks) -> str:
    """As :func:`meet`, but each rank reads its step as its own cell begins: a stop may close step 1 before
    another rank has read it."""
    return kernel(world, h).collective(BODY)


def barriers(world: World, h: Hooks) -> str:
    """Every rank runs %dist_barrier."""
    return kernel(world, h).dist_barrier()


# --- b. the typo race that CI met -----------------------------------------------------------------------------------


TYPO = UsageError("unrecognized arguments: --timeuot")


def typo(world: World, h: Hooks) -> list[Verdict | BaseException]:
    """Rank 1's cell cannot start (a typo in its flags); its person fixes it and runs it again at once. Every other
    rank runs the same cell; when it fails, its person runs it again once the others have settled. How each
    cell ended: the verdict it opened with, or its error."""
    ends: list[Verdict | BaseException] = []
    k = kernel(world, h)
    if world.rank == ODD:
        try:
            k.collective(BODY, start_error=TYPO)
        except UsageError as exc:
            ends.append(exc)
    for _ in range(2):
        try:
            ends.append(k.collective(BODY))
            return ends
        except PeerFailedError as exc:
            ends.append(exc)
            h.later()
    return ends


def check_typo(run: Run) -> None:
    """No rank waits out its timeout; the other ranks' first cell opens, or fails at once with rank 1's reason;
    every rank's last cell opens; the next step works."""
    inv.no_wait_ran_out(run)
    reason = f"{run.describe(ODD)} could not start its cell (UsageError: {TYPO}"
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} ended with {outcome}")
        ends = outcome.value
        first = ends[1] if rank == ODD else ends[0]
        if not _went_on(first) and not (rank != ODD and isinstance(first, PeerFailedError) and reason in str(first)):
            raise Violation(f"{run.describe(rank)}'s cell neither opened nor failed with rank {ODD}'s reason: "
                            f"{first!r}")
        if not _went_on(ends[-1]):
            raise Violation(f"{run.describe(rank)}'s last cell did not open: {ends}")
    inv.meets_again(run)


def _went_on(cell: object) -> bool:
    """The cell opened with a plain go (no rebuild: the scenario's group needs none)."""
    return cell == verdicts.GO


# --- c. %dist_barrier against a cell --------------------------------------------------------------------------------


def barrier_against_cell(world: World, h: Hooks) -> str:
    """Rank 1 runs a cell, every other rank %dist_barrier, at the same step."""
    k = kernel(world, h)
    return k.collective(BODY) if world.rank == ODD else k.dist_barrier()


def check_barrier_against_cell(run: Run) -> None:
    """Every rank is refused, and its message names each rank with what it ran."""
    for rank in sorted(run.outcomes):
        inv.ended_with(run, rank, CellMismatchError)
        text = str(run.outcomes[rank].error)
        others = sorted(i for i in run.outcomes if i != ODD)
        for label in [
            f"rank {ODD}: %%collective #1 (start)",
            f"{ranks_text(others)}: %dist_barrier #1",
        ]:
            if label not in text:
                raise Violation(f"{run.describe(rank)}'s refusal does not say {label!r}: {text}")
    inv.no_wait_ran_out(run)
    inv.meets_again(run)


# --- d. F1: a rank stopped after taking its step, before arriving; another runs the same cell late --------------


def late_after_a_stop(world: World, h: Hooks) -> str:
    """Every rank runs the same cell, each reading its step as its cell begins; rank 1 may be stopped between
    taking its step and arriving at the meeting (see :func:`before_arriving`)."""
    return kernel(world, h).collective(BODY)


def check_late_after_a_stop(run: Run) -> None:
    """No rank other than rank 1 waits out its timeout; one that fails names rank 1's stop."""
    others = [r for r in run.outcomes if r != ODD]
    inv.no_wait_ran_out(run, others)
    inv.no_wait_outlived_its_cause(run)
    for rank in others:
        if run.outcomes[rank].error is not None:
            inv.names(run, rank, ODD, "interrupted its cell")
    inv.meets_again(run)


# --- e. F2: a step whose process group must be rebuilt; a stop anywhere in the first cell -----------------------


CUT = "nbdist closed a stuck collective"  # every rank's group was cut: its next collective rebuilds it first
FIRST_CELL: dict[int, bool] = {}  # per rank, whether its first cell runs (the events land there only)


def in_first_cell(events: str) -> Callable[[int, str, str], str]:
    """``events`` at every gate of a rank's first cell."""
    return lambda rank, op, key: events if FIRST_CELL.get(rank) else ""


def in_odd_first_cell(events: str) -> Callable[[int, str, str], str]:
    """``events`` at every gate of rank 1's first cell."""
    return lambda rank, op, key: events if rank == ODD and FIRST_CELL.get(rank) else ""


def _first_cell(world: World, run: Callable[[], object]) -> object:
    """A rank's first cell, where the events land: its value, or the exception it ended with."""
    FIRST_CELL[world.rank] = True
    try:
        return _how_ended(run)
    finally:
        FIRST_CELL[world.rank] = False


def _how_ended(run: Callable[[], object]) -> object:
    """A cell's value, or the exception it ended with."""
    try:
        return run()
    except (Killed, Hung):
        raise
    except BaseException as exc:
        return exc


def _two_cells(world: World, h: Hooks, cell: Callable[[Kernel], object]) -> tuple[object, object]:
    """The first cell (a stop may land in it), and, once the others have settled, the next one: how each ended
    (its value, or the exception it raised)."""
    k = kernel(world, h, cut=CUT)
    first = _first_cell(world, lambda: cell(k))
    h.later()
    return first, cell(k)


def rebuild_cell(world: World, h: Hooks) -> tuple[object, object]:
    """Every rank runs the same %%collective, whose group must be rebuilt at its start; then the next one."""
    return _two_cells(world, h, lambda k: k.collective(BODY))


def rebuild_plain(world: World, h: Hooks) -> tuple[object, object]:
    """Every rank runs a plain cell whose first collective rebuilds the group (rebuild.ensure); then the next one."""
    return _two_cells(world, h, lambda k: k.plain())


def check_rebuild(run: Run) -> None:
    """No wait runs out or never ends; the stopped rank's first cell ends interrupted, another rank's ends opened
    or with a failure naming it; the next cell works on every rank, and every rank's last group was built on the
    same prefix (the ranks' groups agree)."""
    hit = run.hit()
    inv.no_wait_ran_out(run)
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        first, second = outcome.value
        if isinstance(first, BaseException):
            if rank in hit:
                if not isinstance(first, KeyboardInterrupt):
                    raise Violation(f"{run.describe(rank)} was stopped, and its first cell ended with {first!r}")
            else:
                stopped = [r for r in hit if r != rank]
                if not stopped or not isinstance(first, PeerFailedError) or run.describe(stopped[0]) not in str(first):
                    raise Violation(f"{run.describe(rank)}'s first cell ended with {first!r}, not naming a stop")
        if isinstance(second, BaseException):
            raise Violation(f"{run.describe(rank)}'s next cell failed: {second!r}")
    _last_groups_agree(run)
    inv.meets_again(run)


def _last_groups_agree(run: Run) -> None:
    """Every rank's last group was built on the same prefix (the ranks' groups agree)."""
    last = {rank: built[-1] if (built := groups.BUILDS.prefixes(rank)) else None for rank in sorted(run.outcomes)}
    if len(set(last.values())) > 1:
        raise Violation(f"the ranks' last groups were built on different prefixes: {last}")


# --- f. a driving notebook and its followers ---------------------------------------------------------------------

TOKEN = "explore-drive"  # the world's token: the driving notebook signs its cells with it


def _as_registered(k: Kernel, world: World) -> Kernel:
    """The kernel's session as its registration names it (a follower checks the drive's holder by it)."""
    session = k.session
    session.id = world.ranks[world.rank].session
    session.drive = follow.Drive(session.id)
    session.secret = lambda: TOKEN  # type: ignore[method-assign]
    return k


@dataclass(frozen=True)
class Following:
    """What a follower showed for each of the driver's cells (how it opened, or the error it ended with), when
    (virtual s), and why following ended."""

    shown: list[object]
    when: list[float]
    ended: follow.Ended


def _following(k: Kernel, h: Hooks, first: bool = False) -> Following:
    """%dist_follow in ``k``, as a spawned worker runs it (it draws no table). ``first``: the events land in the
    first driven cell, from the wait for it to what was shown for it."""
    rank, shown, when = k.world.rank, [], []

    def show(what: object) -> None:  # an outcome, or an error: it takes the place of its cell's partial outcome
        FIRST_CELL[rank] = False
        if isinstance(what, BaseException) and shown and cells.partial_of(what) is shown[-1]:
            shown.pop()
            when.pop()
        shown.append(what)
        when.append(h.scheduler.clock.elapsed)

    def started() -> None:
        FIRST_CELL[rank] = first

    try:
        ended = k.session.follow(follow.Shows(None, show, show, lambda seconds: None, started, tables=False))
    finally:
        FIRST_CELL[rank] = False
    return Following([opened(s) if isinstance(s, cells.Outcome) else s for s in shown], when, ended)


def _driving(k: Kernel, h: Hooks, driven: Callable[[], T]) -> T:
    """Rank 0 takes the drive, runs its ``driven`` cells once every other rank follows (waits for its first cell),
    and releases the world: what ``driven`` returned."""
    k.session.drive.take(k.world)
    h.later()  # the followers wait for its first cell
    ran = driven()
    k.session.release()
    return ran


def drive(world: World, h: Hooks, compares: bool = False) -> tuple[object, object] | Following:
    """Rank 0 drives: once every other rank follows, it runs a %%collective (published to them first: F5, the
    stop button while it publishes), then the next one, then releases the world. How each of its cells ended;
    a follower returns what it showed (:class:`Following`)."""
    k = _as_registered(kernel(world, h, rebuilds=True, compares=compares), world)
    if world.rank != 0:
        return _following(k, h)

    def driven() -> tuple[object, object]:
        first = _first_cell(world, lambda: k.collective(BODY))
        h.later()
        return first, _how_ended(lambda: k.collective(BODY))

    return _driving(k, h, driven)


def check_drive(run: Run) -> None:
    """No wait runs out or never ends. The driving notebook's first cell opens, or ends interrupted when it was
    stopped; each follower runs it too, or is told it stopped (naming rank 0), and follows on: the next cell
    opens on every rank, and every follower ends following when the world is released."""
    hit = run.hit()
    inv.no_wait_ran_out(run)
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        if rank == 0:
            first, second = outcome.value
            if isinstance(first, BaseException) and not (0 in hit and isinstance(first, KeyboardInterrupt)):
                raise Violation(f"the driving notebook's first cell ended with {first!r}")
            if isinstance(second, BaseException):
                raise Violation(f"the driving notebook's next cell failed: {second!r}")
            continue
        shown, ended = outcome.value.shown, outcome.value.ended
        errors = [e for e in shown if isinstance(e, BaseException)]
        for error in errors:
            if 0 not in hit or run.describe(0) not in str(error):
                raise Violation(f"{run.describe(rank)} showed {error!r}, not naming the stop of {run.describe(0)}")
        if not shown or isinstance(shown[-1], BaseException):
            raise Violation(f"{run.describe(rank)} did not run the next cell: it showed {shown!r}")
        if not ended.released:
            raise Violation(f"{run.describe(rank)} stopped following: {ended}")
    inv.meets_again(run)


# --- g. a stop that nbdist sends (a watcher's StopRequest: the driver's stop, %dist_stop, --max-time) ------------


def meet_comparing(world: World, h: Hooks) -> list[object]:
    """Every rank runs the same cell, each reading its step as its cell begins (the stopper is armed from
    ``pre_run_cell`` on, where a stop of every rank lands from the kernel's guard), every body comparing its first
    collective with the others' (a barrier of no step). A rank whose cell failed runs it again once the others
    have settled, as its person would: a rank late to a step that a stopped rank closed meets it at the next step
    (``World.missed``). How each cell ended."""
    k = kernel(world, h, rebuilds=True, compares=True)  # a stopped cell may leave a group to rebuild
    ends: list[object] = []
    for _ in range(2):
        ends.append(_how_ended(lambda: k.collective(BODY)))
        if not isinstance(ends[-1], BaseException):
            break
        h.later()
    return ends


def _first_failures(run: Run) -> Iterator[tuple[int, BaseException]]:
    """Each rank whose first cell failed, and how (the programs of :func:`meet_comparing`); a program that raised,
    or a cell that failed again when run again, is a violation."""
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        first, *again = outcome.value
        if again and isinstance(again[-1], BaseException):
            raise Violation(f"{run.describe(rank)}'s cell, run again, failed: {again[-1]!r}")
        if isinstance(first, BaseException):
            yield rank, first


def _the_sent_stop(error: object) -> bool:
    return type(error) is StoppedError and str(error) == SENT


def check_sent(run: Run) -> None:
    """A rank that a sent stop hit ends its cell with that very stop (a StoppedError with its message, never the
    stop button's KeyboardInterrupt, which would end a follower's following), or goes on as if it had not been
    (its stopper was not armed where the stop landed: dropped, as a kernel drops it). Another rank's cell opens,
    ends with the same stop (the body's error is every rank's once the cell opened), or fails promptly naming the
    stopped rank. No wait runs out; every rank's last cell opens; the next step works on every rank."""
    hit = run.hit()
    for rank, first in _first_failures(run):
        if _the_sent_stop(first):
            continue
        if rank in hit:
            raise Violation(f"{run.describe(rank)} was sent a stop, and its cell ended with {first!r}, not that stop")
        stopped = [r for r in hit if r != rank]
        if not stopped or not isinstance(first, PeerFailedError):
            raise Violation(f"{run.describe(rank)}'s cell ended with {first!r}, though no other rank was stopped")
        said = "interrupted its cell" if "interrupted its cell" in str(first) else f"stopped: {SENT}"
        if run.describe(stopped[0]) not in str(first) or said not in str(first):  # a step's meeting, or a comparison
            raise Violation(f"{run.describe(rank)}'s cell ended with {first!r}, not naming the stop")
    inv.no_wait_ran_out(run)
    inv.meets_again(run)


def drive_comparing(world: World, h: Hooks) -> tuple[object, object]:
    """As :func:`drive`, every body comparing its first collective with the others'."""
    return drive(world, h, compares=True)


def at_followers(events: str) -> Callable[[int, str, str], str]:
    """``events`` at every gate of every rank but the driving notebook (rank 0)."""
    return lambda rank, op, key: events if rank != 0 else ""


def check_drive_sent(run: Run) -> None:
    """No wait runs out or never ends. A follower that a sent stop hit shows that stop for its cell (or nothing,
    the stop dropped) and follows on; the driving notebook's cells open, or end with the same stop, or fail naming
    the stopped follower; the next cell opens on every rank, and every follower ends following when the world is
    released (a follower that took the stop for its own stop button would have stopped following)."""
    hit = run.hit()
    inv.no_wait_ran_out(run)
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        if rank == 0:
            first, second = outcome.value
            for cell in (first, second):
                if isinstance(cell, BaseException) and not _the_sent_stop(cell) and not (
                        isinstance(cell, PeerFailedError) and any(run.describe(r) in str(cell) for r in hit)):
                    raise Violation(f"the driving notebook's cell ended with {cell!r}")
            continue
        shown, ended = outcome.value.shown, outcome.value.ended
        for error in (e for e in shown if isinstance(e, BaseException)):
            if not _the_sent_stop(error) and not any(run.describe(r) in str(error) for r in hit if r != rank):
                raise Violation(f"{run.describe(rank)} showed {error!r}, not the stop sent")
        if not ended.released:
            raise Violation(f"{run.describe(rank)} stopped following: {ended}")
    inv.meets_again(run)


def check_stalled(run: Run) -> None:
    """A rank held up (a loaded machine, a person in its debugger) fails no one once it noted its arrival at a
    meeting: a rank that gives up names a rank missing there, never "none", and the rank held up then fails naming
    the one that gave up. Every rank's cell, run again, opens; the next step works on every rank."""
    stalled = run.hit()
    for rank, first in _first_failures(run):
        if isinstance(first, WaitTimeout):
            late = [r for r in stalled if r != rank and f"Missing: {run.describe(r)}" in str(first)]
            if not late:
                raise Violation(f"{run.describe(rank)} gave up naming no rank held up: {first}")
        elif not (isinstance(first, PeerFailedError) and "gave up waiting" in str(first)):
            raise Violation(f"{run.describe(rank)}'s cell ended with {first!r}, though no rank failed")
    inv.meets_again(run)


# --- h. a body that raises before or after its collective ------------------------------------------------------


def raising(where: str) -> Callable[[World, Hooks], object]:
    """Every rank runs the same cell, whose body compares one collective with the others'; rank 1's body raises
    ``where`` ("before" or "after") that collective. How each cell ended."""

    def program(world: World, h: Hooks) -> object:
        k = kernel(world, h, compares=True, raises=where if world.rank == ODD else None)
        return _how_ended(lambda: k.collective(BODY))

    return program


def check_raising(run: Run) -> None:
    """Every rank's cell ends with an error that names rank 1's ValueError (on rank 1, its own, as the magic raises
    it); none waits out its timeout; the next step works on every rank."""
    said = f"{run.describe(ODD)} raised ValueError: {RAISED}"
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        if not isinstance(outcome.value, BaseException) or said not in str(outcome.value):
            raise Violation(f"{run.describe(rank)}'s cell ended with {outcome.value!r}, not saying {said!r}")
    inv.no_wait_ran_out(run)
    inv.meets_again(run)


# --- i. a rank that never comes ----------------------------------------------------------------------------------


def never_comes(world: World, h: Hooks) -> object:
    """Rank 1 runs nothing (its person is away, its kernel alive and idle); every other rank runs a cell."""
    if world.rank == ODD:
        return None
    return _how_ended(lambda: kernel(world, h).collective(BODY))


def check_never_comes(run: Run) -> None:
    """Every other rank waits out its timeout, and no more than a peer check past it, then fails naming rank 1
    as missing (or, told by the first to give up, naming that one); the next step works on every rank (rank 1
    meets them there, told that a step went by)."""
    for rank, outcome in sorted(run.outcomes.items()):
        if rank == ODD:
            continue
        ended = outcome.value
        others = [r for r in run.outcomes if r not in (rank, ODD)]
        gave_up = [r for r in others if f"{run.describe(r)} gave up waiting" in str(ended)]
        if not (isinstance(ended, WaitTimeout) and f"Missing: {run.describe(ODD)}" in str(ended)) and not (
                isinstance(ended, PeerFailedError) and gave_up):
            raise Violation(f"{run.describe(rank)}'s cell ended with {ended!r}, not a timeout naming rank {ODD}")
        if not run.timeout <= outcome.end <= run.timeout + inv.PROMPT:
            raise Violation(f"{run.describe(rank)} gave up at {outcome.end:.1f} s, its timeout {run.timeout:g} s")
    inv.meets_again(run)


# --- j. a re-run of %%dist_init -------------------------------------------------------------------------------------

JOIN_TIMEOUT = 10.0  # virtual seconds: the --timeout of the re-run %%dist_init (it waits for every rank's)


def rejoin(world: World, h: Hooks) -> Rejoined:
    """Every rank runs the same cell (the stop button may land anywhere in it); then its person re-runs
    %%dist_init at once, as :meth:`nbdist.session.Session.init` does at the store: it leaves its round
    (:meth:`World.leave`) and joins the next (:func:`nbdist.world.rendezvous.join`: the first to find the round
    formed opens the next)."""
    return _rerun_init(world, h, _first_cell(world, lambda: kernel(world, h).collective(BODY, start_turn=1)))


def rejoin_instead(world: World, h: Hooks) -> Rejoined:
    """Rank 1's person re-runs %%dist_init while every other rank runs a cell (at any point of it); then theirs."""
    if world.rank == ODD:
        return _rerun_init(world, h, None)  # it ran no cell
    return rejoin(world, h)


def _rerun_init(world: World, h: Hooks, cell: object) -> Rejoined:
    ended = h.scheduler.clock.elapsed  # and it leaves now
    world.leave()
    joined = rendezvous.join(world.client, world.me, world.world_size, JOIN_TIMEOUT)
    joined.last_turn = joined.turns.next() - 1  # as Session.init: the steps before it joined are none it missed
    return Rejoined(cell, ended, joined)


def check_rejoin(run: Run) -> None:
    """Every rank joined the same new round, and its first step works there; a cell that failed did so promptly,
    naming another rank with its cause (that rank's stop, or its leaving for the new world); no wait ran out."""
    inv.no_wait_ran_out(run)
    hit = run.hit()
    ends = {rank: _rejoined(run, rank) for rank in sorted(run.outcomes)}
    rounds = {r.world.round for r in ends.values()}
    if len(rounds) != 1 or min(rounds) <= run.worlds[0].round:
        raise Violation(f"the ranks joined rounds {sorted(rounds)} after round {run.worlds[0].round}")
    for rank, r in ends.items():
        cell = r.cell
        if cell is None or isinstance(cell, Verdict) or (rank in hit and type(cell) is KeyboardInterrupt):
            continue
        if not isinstance(cell, (PeerFailedError, WorldChangedError)):
            raise Violation(f"{run.describe(rank)}'s cell ended with {cell!r}")
        causes = []  # when each rank the message names did what it says (its stop, or its leaving) before it
        for i in ends:
            if i == rank or run.describe(i) not in str(cell):
                continue
            if i in hit and "interrupted its cell" in str(cell):
                causes.append(hit[i].vt)
            if "left" in str(cell):
                causes.append(ends[i].ended)
        causes = [t for t in causes if t <= r.ended]
        if not causes:
            raise Violation(f"{run.describe(rank)}'s cell failed naming no other rank's stop or leaving: {cell!r}")
        if r.ended - min(causes) > inv.PROMPT:
            raise Violation(f"{run.describe(rank)}'s cell failed at {r.ended:.1f} s, {min(causes):.1f} s after its "
                            f"cause: {cell!r}")
    inv.meets_again(run)


def check_rejoin_instead(run: Run) -> None:
    """As :func:`check_rejoin`, and no other rank's cell opened: each failed, at once, naming rank 1."""
    check_rejoin(run)
    for rank in sorted(run.outcomes):
        cell = _rejoined(run, rank).cell
        if rank != ODD and (isinstance(cell, Verdict) or run.describe(ODD) not in str(cell)):
            raise Violation(f"{run.describe(rank)}'s cell did not fail naming rank {ODD}: {cell!r}")


RESTARTS: dict[int, str] = {}  # per round (one per run), how far rank 1's restart got: "killed", "rejoined"


def restarting(plain: bool) -> Callable[[World, Hooks], Rejoined | tuple[object, float, list[object]]]:
    """:func:`restart`, its next cells plain ones whose first collective rebuilds the group if it must."""
    return lambda world, h: restart(world, h, plain)


def restart(world: World, h: Hooks, plain: bool = False) -> Rejoined | tuple[object, float, list[object]]:
    """Every rank runs the same cell, then the next; rank 1's kernel may be killed anywhere in the first. Restarted,
    its %%dist_init takes over its slot in the formed world (:func:`nbdist.world.rendezvous.join`: the holder's
    beat is gone), which moves the world's generation, so that every rank rebuilds its group at the next cell;
    the others do not re-run theirs. A replaced rank has no group until its first cell (Session.init). A next
    cell that fails (told rank 1 is gone, before it was replaced) is run again once the others settled."""
    k = kernel(world, h, rebuilds=True)
    try:
        first = _first_cell(world, lambda: k.collective(BODY, start_turn=1))
    except Killed:
        ended = h.scheduler.clock.elapsed
        again = _restarted(world, h)
        return Rejoined(Killed(), ended, again.world, _until_one_opens(h, again, plain))
    ended = h.scheduler.clock.elapsed
    h.later()
    # A plain cell is run once rank 1's notebook rejoined: the explorer's plain cell models no collective, which
    # before then would fail naming rank 1 gone (as the %%collective of `restart` does).
    while plain and RESTARTS.get(world.round) == "killed":
        h.scheduler.sleep(1.0)
    return first, ended, _until_one_opens(h, k, plain)


def _restarted(world: World, h: Hooks) -> Kernel:
    """Rank 1's killed kernel, started again at once: a new session (and pid), whose %%dist_init takes over its slot
    in the formed world (:func:`nbdist.world.rendezvous.join`: the holder's beat is gone), moving the world's
    generation. Its kernel, which has no group until its first cell (Session.init)."""
    RESTARTS[world.round] = "killed"
    me = replace(world.me, session=f"{world.me.session}-restarted", pid=world.me.pid + 100)
    h.restart(me.session)
    joined = rendezvous.join(world.client, me, world.world_size, JOIN_TIMEOUT)
    joined.last_turn = joined.turns.next() - 1  # as Session.init: the steps before it joined are none it missed
    again = kernel(joined, h, rebuilds=True)
    joined.pg = None
    RESTARTS[world.round] = "rejoined"
    return again


def _until_one_opens(h: Hooks, k: Kernel, plain: bool, tries: int = 3, body: str = BODY) -> list[object]:
    """How each run of the same cell (a plain one, or a %%collective of ``body``) ended, run again once the others
    settled while it fails."""
    def cell() -> object:
        return _how_ended(lambda: (verdicts.rebuild(why) if (why := k.plain()) else verdicts.GO) if plain else
                          k.collective(body))

    ends = [cell()]
    while isinstance(ends[-1], BaseException) and len(ends) < tries:
        h.later()
        ends.append(cell())
    return ends


def check_restart(run: Run) -> None:
    """A cell that failed did so at once, naming the killed rank gone; every rank's last cell opens, and if a kernel
    was restarted every rank rebuilt its group there, on one prefix; no wait ran out."""
    inv.no_wait_ran_out(run)
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        value = outcome.value
        first, ended, then = (value.cell, value.ended, value.then) if isinstance(value, Rejoined) else value
        if isinstance(first, BaseException) and not isinstance(first, Killed):
            _told_gone(run, rank, "first cell", first, ended)
        _then_rebuilt(run, rank, "next cell", then)
    _last_groups_agree(run)
    inv.meets_again(run)


def _told_gone(run: Run, rank: int, what: str, error: object, ended: float | None = None) -> None:
    """``rank``'s ``what`` failed naming rank 1 gone (its kernel was killed); if it ``ended`` then, a cell the kill
    cut, no later than a peer check after the kill."""
    hit, gone = run.hit(), f"{run.describe(ODD)} is gone"
    if ODD not in hit or not isinstance(error, (PeerLostError, PeerFailedError)) or gone not in str(error):
        raise Violation(f"{run.describe(rank)}'s {what} ended with {error!r}, not saying {gone!r}")
    if ended is not None and ended - hit[ODD].vt > inv.PROMPT:
        raise Violation(f"{run.describe(rank)}'s {what} failed at {ended:.1f} s, {ended - hit[ODD].vt:.1f} s after "
                        f"rank {ODD} was killed")


def _then_rebuilt(run: Run, rank: int, what: str, ends: list[object]) -> None:
    """Of how ``rank``'s cells after the kill ended, each but the last failed naming rank 1 gone; the last opened, and
    if rank 1 was killed (and restarted), it rebuilt the group first."""
    for failed in ends[:-1]:
        _told_gone(run, rank, what, failed)
    if not ends or isinstance(ends[-1], BaseException):
        raise Violation(f"{run.describe(rank)}'s last cell failed: {ends!r}")
    if ODD in run.hit() and not (isinstance(ends[-1], Verdict) and ends[-1].rebuild is not None):
        raise Violation(f"{run.describe(rank)}'s last cell did not rebuild its group after the restart: {ends}")


def restart_driven(world: World, h: Hooks) -> tuple[object, float, list[object]] | Following | Rejoined:
    """Rank 0 drives (:func:`drive`), every other rank is a spawned worker following it; rank 1's kernel may be
    killed at any store operation of the first driven cell, from its wait for the cell to what it showed. Its
    driver's supervisor restarts it at once, as a worker kernel is started (issue 47): %load_ext nbdist, its
    %%dist_init with the same rank (:func:`_restarted`: it takes over its slot, moving the world's generation), then
    %dist_follow again. The driver runs its next cell (another source: a follower that took up the first again would
    not meet it unnoticed), again while it fails naming rank 1 gone (before the restart took the slot), then releases
    the world. The driver returns how its first cell ended and when, and each run of the next one; a follower what
    it showed (:class:`Following`), the restarted one in :class:`Rejoined`."""
    k = _as_registered(kernel(world, h, rebuilds=True), world)
    if world.rank != 0:
        try:
            return _following(k, h, first=world.rank == ODD)
        except Killed:
            ended = h.scheduler.clock.elapsed
            again = _restarted(world, h)
            return Rejoined(Killed(), ended, again.world, _following(_as_registered(again, again.world), h))

    def driven() -> tuple[object, float, list[object]]:
        first = _how_ended(lambda: k.collective(BODY))
        ended = h.scheduler.clock.elapsed
        h.later()
        return first, ended, _until_one_opens(h, k, plain=False, body=NEXT)

    return _driving(k, h, driven)


def check_restart_driven(run: Run) -> None:
    """No wait runs out or never ends. Every rank's driven cell that the kill cut (the driver's, another follower's)
    ends at once naming rank 1 gone; the driver's next cell, run again while it fails so, opens with every rank, each
    having rebuilt its group (rank 1, restarted, has none) on one prefix; every follower, rank 1 restarted, shows
    that cell opened and follows until the world is released."""
    inv.no_wait_ran_out(run)
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        value = outcome.value
        if rank == 0:
            first, ended, then = value
            if isinstance(first, BaseException):
                _told_gone(run, rank, "first cell", first, ended)
            _then_rebuilt(run, rank, "next cell", then)
            continue
        restarted = isinstance(value, Rejoined)
        followed: Following = value.then if restarted else value
        then = followed.shown if restarted else followed.shown[1:]  # the cells after the one the kill cut
        if not restarted and followed.shown and isinstance(cut := followed.shown[0], BaseException):
            _told_gone(run, rank, "first driven cell", cut, followed.when[0])
        _then_rebuilt(run, rank, "driven cell", then)
        if not followed.ended.released:
            raise Violation(f"{run.describe(rank)} stopped following: {followed.ended}")
    _last_groups_agree(run)
    inv.meets_again(run)


def _rejoined(run: Run, rank: int) -> Rejoined:
    outcome = run.outcomes[rank]
    if not isinstance(outcome.value, Rejoined):
        raise Violation(f"{run.describe(rank)} did not join again: it {outcome}")
    return outcome.value


# --- k. %dist_status right after a cell -------------------------------------------------------------------------------

LABEL = "%%collective #1"  # the scenario's cell, as the ranks' notes name it


def status_after(world: World, h: Hooks) -> tuple[object, list[str]]:
    """Every rank runs the same cell, then ``%dist_status`` at once, as a person does the moment a cell ended in
    their notebook (CI met it in the driving one): its reads (every rank's note, and the meeting that note waits
    at) fall anywhere among the other ranks' operations at the cell's end. How the cell ended, and what the status
    showed as each rank's last activity."""
    k = kernel(world, h)
    return _how_ended(lambda: k.collective(BODY, start_turn=1)), k.dist_status()


def check_status_after(run: Run) -> None:
    """Every rank's cell opens. A status read once a rank's cell returned (the meeting at its end opened: every rank
    had arrived there, the cell ended on every rank) shows every rank past the cell: none still running it or
    waiting at its start or end, though a rank may not have returned from that meeting yet. The next step works."""
    for rank, outcome in sorted(run.outcomes.items()):
        if outcome.error is not None:
            raise Violation(f"{run.describe(rank)} {outcome}")
        cell, shown = outcome.value
        if not isinstance(cell, Verdict) or not cell.opened:
            raise Violation(f"{run.describe(rank)}'s cell ended with {cell!r}")
        stale = [f"{run.describe(i)}: {what!r}" for i, what in enumerate(shown)
                 if LABEL in what and what != f"finished {LABEL}"]
        if stale:
            raise Violation(f"the %dist_status that {run.describe(rank)} ran after its cell ended showed "
                            f"{'; '.join(stale)}")
    inv.no_wait_ran_out(run)
    inv.meets_again(run)


# --- the table ------------------------------------------------------------------------------------------------------


def scenario(name: str, ranks: int = 2) -> Scenario:
    """The scenario called ``name``, on ``ranks`` ranks."""
    if name not in SCENARIOS:
        raise KeyError(f"no scenario {name!r}; there are {', '.join(SCENARIOS)}")
    return SCENARIOS[name](ranks)


SCENARIOS: dict[str, Callable[[int], Scenario]] = {
    "meet": lambda n: Scenario(
        "meet",
        n,
        meet,
        check_meet,
        everywhere(BEFORE + AFTER),
        about="a. the ranks meet at a step; the stop button at any gate of any rank",
    ),
    "meet-kill": lambda n: Scenario(
        "meet-kill",
        n,
        meet,
        check_meet_kill,
        everywhere(KILL),
        about="the ranks meet at a step; one rank's kernel killed at any gate",
    ),
    "meet-kill-ring": lambda n: Scenario(
        "meet-kill-ring",
        n,
        meet,
        check_meet_kill_ring,
        everywhere(KILL),
        around=ring_of_one,
        about="as meet-kill, each rank looking only at the next one's heartbeat: the others learn it from that one",
    ),
    "typo": lambda n: Scenario(
        "typo", n, typo, check_typo, about="b. rank 1's cell cannot start (a typo), the others run it at once"
    ),
    "barrier-vs-cell": lambda n: Scenario(
        "barrier-vs-cell",
        n,
        barrier_against_cell,
        check_barrier_against_cell,
        about="c. %dist_barrier against a cell at the same step",
    ),
    "late-after-stop": lambda n: Scenario(
        "late-after-stop",
        n,
        late_after_a_stop,
        check_late_after_a_stop,
        before_arriving,
        about="d. F1: rank 1 stopped before arriving; another runs the cell late",
    ),
    "rebuild": lambda n: Scenario(
        "rebuild",
        n,
        rebuild_cell,
        check_rebuild,
        in_first_cell(BEFORE + AFTER),
        around=groups.modelled,
        about="e. F2: a %%collective whose group is rebuilt at its start; the stop button at any gate",
    ),
    "plain-rebuild": lambda n: Scenario(
        "plain-rebuild",
        n,
        rebuild_plain,
        check_rebuild,
        in_first_cell(BEFORE + AFTER),
        around=groups.modelled,
        about="e. F2: a plain cell's first collective rebuilds the group; the stop button at any gate",
    ),
    # Beyond the list: for the command line (python -m tests.explore), and findings.
    "meet-late": lambda n: Scenario(
        "meet-late",
        n,
        meet_late,
        check_meet,
        everywhere(BEFORE + AFTER),
        about="a, each rank reading its step as its cell begins",
    ),
    "meet-twice": lambda n: Scenario(
        "meet-twice",
        n,
        meet,
        check_meet,
        everywhere(BEFORE + AFTER),
        max_events=2,
        about="a, with two presses of the stop button (on one rank or two)",
    ),
    "drive": lambda n: Scenario(
        "drive",
        n,
        drive,
        check_drive,
        in_first_cell(BEFORE + AFTER),
        around=groups.modelled,
        about="f. F5: rank 0 drives the others; the stop button at any gate of its first cell",
    ),
    "barriers": lambda n: Scenario(
        "barriers",
        n,
        barriers,
        check_meet,
        everywhere(BEFORE + AFTER),
        about="every rank runs %dist_barrier; the stop button at any gate",
    ),
    "meet-sent": lambda n: Scenario(
        "meet-sent",
        n,
        meet_comparing,
        check_sent,
        everywhere(SENT_BEFORE + SENT_AFTER),
        around=groups.modelled,
        about="g. F6, F7: a stop that nbdist sends (through the kernel's stopper) at any gate of any rank",
    ),
    "drive-sent": lambda n: Scenario(
        "drive-sent",
        n,
        drive_comparing,
        check_drive_sent,
        at_followers(SENT_BEFORE + SENT_AFTER),
        around=groups.modelled,
        about="g. F6, F7: rank 0 drives; a stop sent to a follower at any gate",
    ),
    "compare-stall": lambda n: Scenario(
        "compare-stall",
        n,
        meet_comparing,
        check_stalled,
        everywhere(STALLED),
        around=groups.modelled,
        about="a rank held up (a loaded machine, its debugger) at any gate of a cell whose body compares a collective",
    ),
    "raise-before": lambda n: Scenario(
        "raise-before",
        n,
        raising("before"),
        check_raising,
        about="h. rank 1's body raises before its collective, which the others wait in",
    ),
    "raise-after": lambda n: Scenario(
        "raise-after",
        n,
        raising("after"),
        check_raising,
        about="h. rank 1's body raises after its collective, which every rank ran",
    ),
    "never-comes": lambda n: Scenario(
        "never-comes",
        n,
        never_comes,
        check_never_comes,
        about="i. rank 1 never comes (alive, idle); the others wait out their timeout and name it",
    ),
    "rejoin": lambda n: Scenario(
        "rejoin",
        n,
        rejoin,
        check_rejoin,
        in_first_cell(BEFORE + AFTER),
        about="j. every rank re-runs %%dist_init after a cell; the stop button at any gate of that cell",
    ),
    "rejoin-instead": lambda n: Scenario(
        "rejoin-instead",
        n,
        rejoin_instead,
        check_rejoin_instead,
        about="j. rank 1 re-runs %%dist_init while the others run a cell; then they re-run theirs",
    ),
    "restart": lambda n: Scenario(
        "restart",
        n,
        restart,
        check_restart,
        in_odd_first_cell(KILL),
        around=groups.modelled,
        about="j. rank 1's kernel killed anywhere in a cell and restarted: it takes over its slot; the next cell "
              "rebuilds on every rank",
    ),
    "restart-plain": lambda n: Scenario(
        "restart-plain",
        n,
        restarting(plain=True),
        check_restart,
        in_odd_first_cell(KILL),
        around=groups.modelled,
        about="j. the same, the next cells plain ones: their first collective rebuilds the group on every rank",
    ),
    # With World.enter_generation no longer re-reading the registrations (the driver keeps the dead session of rank
    # 1, whose beat says gone, and fails every run of its next cell naming it), 34 of 36 runs fail at bound 0, 371 of
    # 425 at bound 1, 27 of 100 seeds with 3 ranks. `restart` passes it at bounds 0 and 1 and with 100 seeds: there,
    # as we read it, rank 1 restarted reaches the next cell before rank 0 waits long on it; a follower always comes
    # after its driver, which waits for it, checking the stale registration.
    "restart-driven": lambda n: Scenario(
        "restart-driven",
        n,
        restart_driven,
        check_restart_driven,
        in_odd_first_cell(KILL),
        around=groups.modelled,
        about="j. rank 0 drives; rank 1, a spawned worker, killed anywhere in a driven cell and restarted: it takes "
              "over its slot and follows again; the driver's next cell rebuilds on every rank",
    ),
    # Found again with World.barrier's fix of ec05cf5 reverted (a rank counted in before its note): at bound 1, 2 of
    # 38 runs fail; at 2, 25 of 492. With the opener's note of eab7c67 gone too, 4 of 38 and 54 of 482 (the waiter
    # then reads the opener's "running"). 3 ranks, random: 7 of 2000 seeds.
    "status-end": lambda n: Scenario(
        "status-end",
        n,
        status_after,
        check_status_after,
        about="k. every rank runs %dist_status as its cell ends: no rank shows as still in the cell",
    ),
}
