"""The error a ``%%collective`` ends with on this rank, once its table is shown: a table of rules, first match wins.

Each rule reads the cell's :class:`~nbdist.cell.cells.Outcome` and this rank's own error (its capture's, or None)
and gives the error, or None to let the next rule decide. Their order is the decision: this rank's own stop comes
first, then its own error, then the failure that cut the cell short elsewhere (the same nbdist error on every
rank, or what cut it), then its own error that followed from that, then collectives that did not match, then
another rank's error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .. import errors, ranksets
from ..errors import (
    CollectiveError,
    CollectiveMismatchError,
    NbdistError,
    PeerFailedError,
    PeerLostError,
    StoppedError,
    StoreConnectionError,
)
from ..view import alike, tracebacks
from ..world.capture_record import Raised
from ..world.world import World
from .cells import Outcome
from .names import lacking
from .watch import SERVER

Own = Raised | None  # this rank's error, as its capture holds it (None: it raised nothing)
Ours = Callable[[], Iterable[str]]  # the names this notebook's namespace holds (asked for only when needed)
Rule = Callable[[World, Outcome, Own, Ours], BaseException | None]

# Who cut the cell short, when the rank that failed first raised nothing of nbdist's own.
_CUT_BY: dict[str, type[NbdistError]] = {"lost": PeerLostError, SERVER: StoreConnectionError}


def _stopped_here(world: World, outcome: Outcome, own: Own, ours: Ours) -> BaseException | None:
    """This rank's stop button, or ``q`` in its debugger (a driven rank's: the cell ended, not following)."""
    if own is None or not own.interrupted:
        return None
    if own.ename == "BdbQuit":
        return StoppedError(f"{world.describe(world.rank)} quit its debugger (q): the cell ended on every rank")
    stopped = KeyboardInterrupt()
    stopped._render_traceback_ = lambda: [  # type: ignore[attr-defined]  # the stop button: one line, no frames
        "KeyboardInterrupt: this rank's cell was stopped; the other ranks were told (its table is above)"]
    return stopped


def _raised_here(world: World, outcome: Outcome, own: Own, ours: Ours) -> BaseException | None:
    """This rank's own error, not one that followed from a stop elsewhere."""
    return _own_error(world, outcome, own) if own is not None and not own.consequence else None


def _cut_by_another(world: World, outcome: Outcome, own: Own, ours: Ours) -> BaseException | None:
    """Another rank's failure cut the cell short: its nbdist error, the same on every rank, or what cut it."""
    reason = outcome.reason
    if reason is None or reason.rank == world.rank:
        return None
    captures = outcome.captures
    cut_by = captures[reason.rank] if 0 <= reason.rank < len(captures) else None
    cause = None if cut_by is None else cut_by.error
    same = errors.by_name(cause.ename) if cause is not None and not cause.consequence else None
    if cause is not None and same is not None:
        return same(cause.evalue)
    return _CUT_BY.get(reason.kind, PeerFailedError)(
        f"{reason.message} (this rank's cell was stopped; its column shows where)")


def _followed_here(world: World, outcome: Outcome, own: Own, ours: Ours) -> BaseException | None:
    """This rank's own error that followed from its own stop (nothing cut the cell elsewhere)."""
    return _own_error(world, outcome, own) if own is not None else None


def _mismatched(world: World, outcome: Outcome, own: Own, ours: Ours) -> BaseException | None:
    """Collectives that ran but did not match across ranks (seen after the body)."""
    return CollectiveMismatchError(outcome.mismatch) if outcome.mismatch is not None else None


def _failed_elsewhere(world: World, outcome: Outcome, own: Own, ours: Ours) -> BaseException | None:
    """Another rank's error: a stop, nbdist's own error (the same class here), or the user's, named."""
    failed = [(i, c.error) for i, c in enumerate(outcome.captures) if c is not None and c.error is not None]
    if not failed:
        return None
    if any(e.interrupted for _, e in failed):
        who = ", ".join(world.describe(i) for i, e in failed if e.interrupted)
        return PeerFailedError(f"{who} interrupted its cell")
    named = [(cls, e) for _, e in failed if (cls := errors.by_name(e.ename)) is not None and not e.consequence]
    if named:
        cls, first = named[0]
        return cls(first.evalue)
    said: dict[tuple[str, str], tuple[list[int], list[str]]] = {}  # alike errors, said once for their ranks
    for i, e in failed:
        ranks, sentences = said.setdefault((e.ename, alike.key(f"{e.evalue}{lacking(e, ours)}", i)), ([], []))
        ranks.append(i)
        sentences.append(f"{world.describe(i)} raised {e.ename}: {e.evalue}{lacking(e, ours)}")
    names = "; ".join(alike.merge(sentences, ranks) for ranks, sentences in said.values())
    return CollectiveError(f"{names} (traceback in its column above)")


RULES: tuple[Rule, ...] = (_stopped_here, _raised_here, _cut_by_another, _followed_here, _mismatched,
                           _failed_elsewhere)


def error_for(world: World, outcome: Outcome, ours: Ours = tuple) -> BaseException | None:
    """The error this rank's cell must end with, if any (after the table is shown): the first rule's. ``ours``: the
    names this notebook holds, which another rank's ``NameError`` may say it lacks (:mod:`nbdist.cell.names`)."""
    mine = outcome.captures[world.rank]
    own = None if mine is None else mine.error
    return next((error for rule in RULES if (error := rule(world, outcome, own, ours)) is not None), None)


def _own_error(world: World, outcome: Outcome, own: Raised) -> BaseException:
    """This rank's own error, said in one line: its traceback is in the table above (unless ``--show`` left this
    rank's column out), so under the table it is not said again."""
    cls = errors.by_name(own.ename)
    if cls is not None:
        return cls(own.evalue)  # nbdist's own error: the same class on every rank
    shown = outcome.show is None or world.rank in outcome.show
    said = f"{world.describe(world.rank)} raised {own.ename}: {own.evalue}{_as_did(world, outcome, own)}"
    if not shown:  # said only here: its traceback as its column would show it
        return CollectiveError(said, tracebacks.readable(own.short or own.traceback or ""))
    return CollectiveError(f"{said} (its traceback is in the table above)")


def _as_did(world: World, outcome: Outcome, own: Raised) -> str:
    """``, as did ranks 1-3``: the other ranks whose body raised the same error (:mod:`nbdist.view.alike`)."""
    mine = alike.key(own.evalue, world.rank)
    same = [i for i, c in enumerate(outcome.captures) if i != world.rank and c is not None and c.error is not None
            and not c.error.consequence and c.error.ename == own.ename and alike.key(c.error.evalue, i) == mine]
    return f", as did {ranksets.ranks_text(same)}" if same else ""
