"""The %%collective protocol for one cell on one rank.

1. Publish this rank's source, flags and process-group state; meet the others
   at the world's next step (:func:`~nbdist.world.gather.meet`, barrier
   "in"). The last to arrive decides for everyone: refuse (the sources or flags
   differ, or another rank reached another kind of step), rebuild the process
   group first (a rank cannot trust it, or the world moved to a new generation
   while the ranks waited), or go.
2. Refuse, on every rank, if told to.
3. Rebuild the process group if told to (every rank at the same point).
4. Run the body with a :class:`~nbdist.cell.watch.CellWatch` beside it, its
   collectives checked (:mod:`nbdist.cell.fingerprint`), and its table published
   live (:mod:`nbdist.cell.live`) once it has run for 0.5 s. A rank outside the
   cell's ``--ranks`` skips the body: its capture is one note, and it goes on
   to step 5 at once (the checker refuses a member's collective that would wait
   for such a rank).
5. Publish the capture, this rank's process-group state and any failure;
   meet again (barrier "out", which waits without limit for a rank still
   running the body while it lives, up to ``--max-time``). The last to
   arrive reads every rank's record and tells every rank what it found
   there (:mod:`nbdist.cell.ending`): whether the group can still be
   trusted (if not, it is rebuilt at the next cell that uses it), collectives
   that did not match, who failed. A rank that shows the table reads every
   rank's capture; one that shows none, only the failed ranks'.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .. import ranksets
from ..backend import procgroup
from ..errors import (
    ConfigError,
    MaxTimeError,
    StoreConnectionError,
)
from ..view import trace
from ..view.shrink import fit
from ..world import keys
from ..world import verdict as verdicts
from ..world.capture_record import Capture, Raised
from ..world.gather import Gathering
from ..world.records import Arrival, CellStart, Failure, Registration
from ..world.store import StoreClient
from ..world.verdict import Verdict
from ..world.world import World, step_name
from . import capture, ending
from .fingerprint import CUT_SIGNS, Checker, at_work, raise_if_failed
from .inflight import Since
from .live import LiveTable, cell_line, where
from .outputlog import OutputLog
from .step import CELL, Plan, drive
from .stopper import Stopper
from .turn import Ending, Meeting, Turn
from .watch import SERVER, CellWatch, publish

MAX_SOURCE_CHARS = 64 * 1024
MAX_TIME_GRACE = 2.0  # seconds past --max-time a finished rank waits for one whose body its watcher is ending
# Errors that follow from a stop elsewhere (a refused or cut collective), not from this rank's own code.
_CONSEQUENCES = ("PeerFailedError", "DistBackendError", "DistNetworkError", "DistError")


@dataclass
class Outcome:
    """What a cell produced on every rank, why it was cut short (if it was), and what the group needs."""

    number: int
    captures: list[Capture | None]  # by rank; None: none came (or a rank that shows no table read none)
    reason: Failure | None = None  # the first failure, which cut the cell short on every rank
    rebuilt: str | None = None  # why the process group was rebuilt before this cell
    distrusted: str | None = None  # why it will be rebuilt at the next cell
    holders: list[str] = field(default_factory=list)  # names that hold the old group
    live_id: str | None = None  # the display id of the live table, which the final table replaces
    mismatch: str | None = None  # collectives that ran but did not match across ranks (seen after the body)
    view: str | None = None  # how the table is drawn: "ranks", "groups" or None (by the number of ranks)
    show: tuple[int, ...] | None = None  # the ranks whose columns the table shows (None: every rank's)
    where: str | None = None  # where every rank was while the cell hung (nbdist.debug.hangs), if it asked


_PARTIAL = "nbdist_partial_outcome"  # the one attribute by which an exception carries a cell's partial outcome


def cut_short(exc: BaseException, outcome: Outcome | None) -> None:
    """Let ``exc``, which cuts a cell short, carry what the ranks produced so far (:func:`partial_of` reads it), for
    the magic to show beside the error. An attribute, since the stop button's KeyboardInterrupt is raised where it
    lands and cannot be a class of nbdist's."""
    setattr(exc, _PARTIAL, outcome)


def partial_of(exc: BaseException) -> Outcome | None:
    """What the ranks produced before ``exc`` cut a cell short (:func:`cut_short`), or None."""
    got = getattr(exc, _PARTIAL, None)
    return got if isinstance(got, Outcome) else None


def _flags_text(flags: dict[str, Any]) -> str:
    words = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}" if isinstance(v, str) else f" {v:g}")
             for k, v in sorted(flags.items()) if v]
    return " ".join(words) or "no flags"


def start_verdict(world: World, arrivals: list[Arrival]) -> Verdict:
    """What the last rank to arrive at a cell decides for every rank: refuse, rebuild first, or go."""
    records = [a.cell for a in arrivals if a.cell is not None]
    assert len(records) == len(arrivals), "every rank reached a cell (gather.meet refuses other kinds first)"
    flags: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        flags.setdefault(_flags_text(rec.flags), []).append(i)
    if len(flags) > 1:
        return verdicts.refused("the ranks ran %%collective with different flags, which change how the cell runs "
                                f"({ranksets.who_said(flags)}); nothing ran. Use the same %%collective line in every "
                                "notebook")
    if not records[0].flags.get("allow_different"):
        refusal = compare_sources(records)
        if refusal is not None:
            return verdicts.refused(refusal)
    whys = {rec.pg.get("why") for rec in records if not rec.pg.get("ok")}
    if len(whys) == 1 and all(not rec.pg.get("ok") for rec in records):
        why = whys.pop()  # every rank says the same (the world moved on): say it once
    else:
        why = procgroup.verdict({i: rec.pg for i, rec in enumerate(records)})
    if why is None:
        gen = world.generations.stored()  # now, not when each rank arrived: it may have moved while they waited
        older = [i for i, rec in enumerate(records) if rec.pg.get("gen", gen) != gen]
        if older:
            why = (f"{ranksets.ranks_text(older)}: the world moved on while they waited (a rank rejoined, or "
                   "another rank's process group failed)")
    return verdicts.rebuild(why) if why else verdicts.GO


def compare_sources(records: list[CellStart]) -> str | None:
    """Why the ranks may not run this cell (they entered it with different code), or None."""
    groups: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        groups.setdefault(rec.hash, []).append(i)
    if len(groups) == 1:
        return None
    (first, *others) = groups.values()
    parts = []
    for ranks in others:
        diff = difflib.unified_diff(
            records[first[0]].code.splitlines(), records[ranks[0]].code.splitlines(),
            ranksets.ranks_text(first), ranksets.ranks_text(ranks), lineterm="", n=1,
        )
        parts.append("\n".join(diff))
    who = "; ".join(f"{ranksets.ranks_text(r)} ran version {k + 1}" for k, r in enumerate(groups.values()))
    return (
        f"the ranks entered this %%collective with different code ({who}); nothing ran. "
        "Run the same cell in every notebook, or use %%collective --allow-different on purpose.\n"
        + "\n".join(parts)
    )


@dataclass(frozen=True)
class Flags:
    """How a %%collective runs: its line's flags (every rank must give the same)."""

    timeout: float  # each barrier's wait for ranks that are not at work in this cell
    check: bool = True  # compare each collective's fingerprint
    same_code: bool = True  # refuse ranks whose code differs
    max_time: float | None = None  # bound on the body, on every rank
    live: bool = True  # show the live table (this notebook's choice: not compared across ranks)
    trace: bool = False  # record when each collective entered and left, on every rank
    ranks: tuple[int, ...] | None = None  # --ranks: the ranks that run the body (None: every rank)
    view: str | None = None  # --view (or %dist_config view=): how the tables are drawn; not compared
    show: tuple[int, ...] | None = None  # --show: the ranks whose columns the tables show; not compared
    find_divergence: bool = False  # --find-divergence: record the body's operations and compare them
    replicas: tuple[int, ...] | None = None  # --replicas: the ranks that must agree (None: every rank)

    def __post_init__(self) -> None:
        for name in ("ranks", "show", "replicas"):
            value = getattr(self, name)
            if value is not None:  # a follower's comes as a JSON list
                object.__setattr__(self, name, tuple(sorted(set(value))))

    def compared(self) -> dict[str, Any]:
        """The flags every rank must give alike, as its record at the cell's start holds them."""
        return {"no_check": not self.check, "allow_different": not self.same_code, "max_time": self.max_time,
                "trace": self.trace, "ranks": None if self.ranks is None else ranksets.fold(self.ranks),
                **({"find_divergence": True, "replicas": self.replicas and ranksets.fold(self.replicas)}
                   if self.find_divergence else {})}

    def sent(self) -> dict[str, Any]:
        """The flags as a driver sends them to its followers (:meth:`received` reads them back). ``live`` is each
        notebook's own choice, not sent; a follower draws its tables as the driver's ``view`` and ``show`` say."""
        return {"timeout": self.timeout, "check": self.check, "same_code": self.same_code, "max_time": self.max_time,
                "trace": self.trace, "ranks": None if self.ranks is None else list(self.ranks), "view": self.view,
                "show": None if self.show is None else list(self.show),
                **({"find_divergence": True, "replicas": self.replicas and list(self.replicas)}
                   if self.find_divergence else {})}

    @classmethod
    def received(cls, value: dict[str, Any]) -> Flags:
        """A driver's flags as its signed message carries them (:meth:`sent`; the rank lists as JSON lists)."""
        return cls(**value)


def rank_set(text: str | None, world_size: int | None, flag: str = "--ranks") -> tuple[int, ...] | None:
    """The ranks of ``--ranks TEXT`` (None: the flag was not given); a malformed or out-of-range set is refused."""
    if text is None:
        return None
    try:
        return tuple(ranksets.parse(text, world_size))
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def skipped(ranks: tuple[int, ...]) -> Capture:
    """The capture of a rank outside ``--ranks``: one note, no error, no time."""
    who = ranksets.ranks_text(ranks)
    return Capture(outputs=[{"kind": "note", "text": f"skipped: this cell runs on {who} only (--ranks)"}],
                   result=None, error=None, wall=0.0)


Ran = tuple[Capture, Failure | None, bool]  # a body's capture, why its watch stopped it, whether the button did


@dataclass(frozen=True)
class Body:
    """What running one rank's body needs (:func:`watched_body`)."""

    world: World
    watch_client: StoreClient
    cell: str
    label: str
    shell: Any
    source: str
    output: OutputLog
    checker: Checker
    live: LiveTable
    flags: Flags
    stopper: Stopper | None
    driver: int | None
    activate: Callable[[Checker | None], None]
    turn: Turn
    keep: capture.Keep | None = None  # told how the body ended (%dist_pdb keeps a failure)
    aids: Any = None  # breakpoints in the body, and the hang report (nbdist.debug.aids.Aids)
    hang: Any = None  # this cell's hang report (nbdist.debug.hangs.Hang), if this rank asks for one
    around: capture.Around | None = None  # wraps the body's code (--find-divergence: nbdist.diverge.oplog)


def watched_body(b: Body) -> Ran:
    """Run the body with a :class:`~nbdist.cell.watch.CellWatch` beside it; its capture, why the watcher stopped
    it (or None) and whether the stop button did."""
    def on_tick() -> None:  # the watcher's slice: the live table, and where every rank is once it waits long
        b.live.tick()
        if b.hang is not None:
            b.hang.tick()

    with CellWatch(b.world, b.watch_client, b.cell, b.checker, b.label, on_tick=on_tick,
                   max_time=b.flags.max_time, stopper=b.stopper, driver=b.driver, since=Since()) as watch:
        if b.hang is not None:
            b.hang.stuck_since = watch.stuck_since
        b.activate(b.checker)
        if b.stopper is not None:
            b.stopper.arm()
        armed = (contextlib.nullcontext() if b.aids is None
                 else b.aids.breakpoints.armed(b.world, b.cell, b.label, b.source, b.driver))
        try:
            with b.turn.stops.released(), armed:
                cap = capture.run_cell(b.shell, b.source, b.output, b.keep, b.around)
        finally:
            if b.stopper is not None:
                b.stopper.pause()  # the body is over: from here on a stop must not land in this cell's bookkeeping
                b.stopper.disarm()
            b.activate(None)
    return cap, watch.reason, watch.interrupted


def new_namespace(world: World, replaced: Registration, spawned: bool) -> str:
    """What the first cell of a kernel that took over another's slot says: its namespace is new, the others' not."""
    back = ("%dist_replay in the driving notebook runs the earlier cells that called no collective here again; "
            if spawned else "")
    return (f"nbdist: this kernel took over rank {world.rank}'s slot from pid {replaced.pid} on {replaced.host}, "
            f"which is gone: its namespace is new, and the other ranks kept theirs. {back}%dist_sync NAME... copies "
            "what a surviving rank holds")


def around(run_body: Callable[[Body], Ran], wrap: capture.Around) -> Callable[[Body], Ran]:
    """``run_body``, the body's code run inside ``wrap()`` (:func:`nbdist.cell.capture.run_cell`)."""
    return lambda b: run_body(replace(b, around=wrap))


def noted(run_body: Callable[[Body], Ran], note: str) -> Callable[[Body], Ran]:
    """``run_body``, its capture opening with ``note``."""
    def body(b: Body) -> Ran:
        cap, reason, interrupted = run_body(b)
        return replace(cap, outputs=[{"kind": "note", "text": note}, *cap.outputs]), reason, interrupted

    return body


def run(world: World, shell: Any, source: str, flags: Flags, watch_client: StoreClient,
        params: dict[str, list[str]], activate: Callable[[Checker | None], None], rebuild: Callable[[int], None],
        turn: Turn, state: dict[str, Any], stopper: Stopper | None = None, driver: int | None = None,
        draw_live: bool = True, run_body: Callable[[Body], Ran] = watched_body, keep: capture.Keep | None = None,
        aids: Any = None, shows_table: bool = True) -> Outcome:
    """Run ``source`` on this rank as the world's step ``turn.step``, in lockstep with the others (see the module
    docstring).

    ``turn`` is this rank's turn, claimed at that step (:mod:`nbdist.cell.turn`); ``state`` is this rank's
    process-group state, as the others judge it (with the generation it was built in); ``activate`` hands
    the cell's checker to nbdist's wrappers (None when the body ends); ``rebuild(step)`` rebuilds the
    process group on this rank at that step. Whatever ends this rank's part early (the stop button
    anywhere in it, an error of nbdist's own) ends its turn (:meth:`~nbdist.cell.turn.Turn.abort`), so
    no rank waits for it. ``stopper`` lets the watcher end the body (--max-time, a stop of every rank);
    ``driver``, on a follower, is the rank whose stop button ends this body too; ``draw_live`` False (a
    rank with no front end, ``nbdist follow``): it publishes its part of the live table and draws none.
    ``run_body`` runs the body (:func:`watched_body`; the interleaving explorer's ranks have none);
    ``keep`` is told how it ended (:func:`nbdist.cell.capture.run_cell`); ``aids`` arms breakpoints during it
    and reports where every rank was if the cell hangs (:class:`nbdist.debug.aids.Aids`). ``shows_table`` False:
    nobody draws this rank's table of the cell (a spawned worker, ``nbdist follow``), so it reads only the
    captures its own error needs (:mod:`nbdist.cell.ending`); the outcome holds None for the others'.
    """
    step = turn.step
    assert step is not None, "the turn claims its step first"
    run = _CellRun(world, step, shell, source, flags, watch_client, params, activate, stopper, driver,
                   state, draw_live, turn, run_body, keep, aids, shows_table)
    outcome = drive(turn, world, Plan(CELL, run.meeting, source, build=rebuild, work=run))
    assert outcome is not None, "a cell's step ends with its outcome"
    return outcome


@dataclass
class _CellRun:
    """One ``%%collective`` on this rank: what its step's meetings are, its body and its end (the driver,
    :func:`nbdist.cell.step.drive`, runs them in the turn's phases); see :func:`run`."""

    world: World
    n: int
    shell: Any
    source: str
    flags: Flags
    watch_client: StoreClient
    params: dict[str, list[str]]
    activate: Callable[[Checker | None], None]
    stopper: Stopper | None
    driver: int | None
    state: dict[str, Any]
    draw_live: bool
    turn: Turn
    run_body: Callable[[Body], Ran]
    keep: capture.Keep | None
    aids: Any
    shows_table: bool
    # Set as the cell goes: why the group was rebuilt at its start, its body's watch, the live table, the hang
    # report, when the body began, what the body left (its capture, why the watcher stopped it, whether the stop
    # button did), and what this rank published at its end.
    rebuilt: str | None = None
    checker: Checker | None = None
    live: LiveTable | None = None
    hang: Any = None
    body_started: float = 0.0
    ran: Ran | None = None
    published: str = ""
    reason: Failure | None = None
    every: list[Capture | None] | None = None  # every rank's record, if this rank read them to decide

    @property
    def cell(self) -> str:
        return step_name(self.n)

    @property
    def label(self) -> str:
        return f"%%collective #{self.n}"

    def meeting(self, n: int) -> Meeting:
        """The cell's meeting at its start: the last to arrive decides (:func:`start_verdict`) to refuse, rebuild
        the process group first, or go."""
        world, state, source, flags = self.world, self.state, self.source, self.flags
        start = CellStart(hashlib.sha256(source.encode()).hexdigest(), source[:MAX_SOURCE_CHARS], state,
                          flags.compared())
        hint = None if state.get("ok") else ("Every rank must rebuild the process group at this cell's start first "
                                             f"({state.get('why')})")
        return Meeting("cell", f"{self.label} (start)", flags.timeout, cell=start,
                       verdict=lambda records: start_verdict(world, records), on_missed=say, hint=hint)

    def body(self, opened: Verdict) -> None:
        """Run the body under its watch (a rank outside ``--ranks`` skips it), keeping its capture, why the watcher
        stopped it (or None), and whether the stop button did."""
        self.rebuilt = opened.rebuild
        self.ran = self._body()

    def _body(self) -> Ran:
        world, flags, cell, label, aids = self.world, self.flags, self.cell, self.label, self.aids
        checker = self.checker = Checker(world, cell, flags.timeout, self.params, compare=flags.check,
                                         on_tick=lambda: raise_if_failed(world, cell), trace=flags.trace,
                                         ranks=flags.ranks, compare_at=self.turn.compare)
        output = OutputLog()
        body_thread = threading.get_ident()  # the body runs here: the live table samples where it is
        # No front end (nbdist follow): publish this rank's part for the notebooks, draw nothing. A plain shell prints
        # each display to stdout, which during the body is the body's own output: the table would fill its column.
        publisher = self.shell.display_pub if self.draw_live else None
        live = self.live = LiveTable(
            world, cell, f"{label} · {world.world_size} ranks", output, publisher, flags.live, view=flags.view,
            show=flags.show, place=lambda: (None if aids is None else aids.breakpoints.place()) or where(
                checker.inside or checker.reaching, cell_line(body_thread)))
        self.body_started = time.monotonic()
        hang = self.hang = None if aids is None else aids.hang(world, asks=self.driver is None)
        if flags.ranks is not None and world.rank not in flags.ranks:
            # Not at work in the body (no "body" in the note): the members' end barrier need not wait for this rank.
            world.notes.write(f"skipping {label} (--ranks {ranksets.fold(flags.ranks)})", cell=self.n)
            return skipped(flags.ranks), None, False
        world.notes.write(f"running {label}", cell=self.n, body=cell)
        return self.run_body(Body(world, self.watch_client, cell, label, self.shell, self.source, output, checker,
                                  live, flags, self.stopper, self.driver, self.activate, self.turn, self.keep, aids,
                                  hang))

    def outcome(self, captures: list[Capture | None]) -> Outcome:
        assert self.live is not None
        return Outcome(self.n, captures, self.reason, self.rebuilt, live_id=self.live.display_id,
                       view=self.flags.view, show=self.flags.show,
                       where=None if self.hang is None else self.hang.text())

    def end(self) -> Ending:
        """Publish this rank's record, and its failure first if it failed (the first failure is every rank's
        reason, kept as the reason the cell was cut short); the meeting at the cell's end."""
        assert self.ran is not None
        self.published, self.reason = self.publish(*self.ran)
        return self.ending()

    def publish(self, cap: Capture, reason: Failure | None, interrupted: bool) -> tuple[str, Failure | None]:
        """The record as published, and the reason the cell was cut short (None: it was not)."""
        world, cell, checker, live = self.world, self.cell, self.checker, self.live
        assert checker is not None and live is not None
        if self.hang is not None:
            body_ended = time.monotonic()
            self.hang.stuck_since = lambda: body_ended  # at the cell's end, waiting for the others
        live.finish(cap)
        record: Capture
        try:
            record = _record(world, cap, checker, interrupted)
        except Exception as exc:  # nbdist's own bookkeeping failed: this rank's error, published at once
            record = _capture_failure(world, cap, exc)
        if reason is not None and reason.kind == SERVER:
            # Nobody can be told and no barrier can be met: end now, with this rank's own column.
            if world.pg is not None:
                world.pg.distrust("the rendezvous server went away")
            failure = StoreConnectionError(reason.message)
            mine = [record if i == world.rank else None for i in range(world.world_size)]
            self.reason = reason
            cut_short(failure, self.outcome(mine))
            raise failure
        error = record.error
        if error is not None and reason is None:
            kind = "interrupted" if error.interrupted else "error"
            me = world.describe(world.rank)
            message = (f"{me} raised {error.ename}: {error.evalue}" if kind == "error"
                       else f"{me} quit its debugger (q)" if error.ename == "BdbQuit"
                       else f"{me} interrupted its cell")
            first = publish(world.client, world, cell, Failure(world.rank, kind, message))
            if first.rank != world.rank:
                reason = first  # another rank failed first
        if reason is not None and reason.rank != world.rank:
            if error is not None:
                error = replace(error, consequence=_is_consequence(error, checker))
                record = replace(record, error=error)
            if error is None or error.consequence:
                record = replace(record, cancelled=reason.message)
        published = fit(record.as_dict())
        world.client.set(world.key(keys.out(cell, world.rank)), published)
        return published, reason

    def ending(self) -> Ending:
        """Every rank meets at the cell's end; the last to arrive reads every record and tells every rank what it
        found (:mod:`nbdist.cell.ending`)."""
        world, cell, label, flags, live = self.world, self.cell, self.label, self.flags, self.live
        assert live is not None

        def decide() -> Verdict:  # the last to arrive: what every rank must know from every record, found once
            self.every = ending.read(world, cell, list(range(world.world_size)))
            return verdicts.go(ending.find(self.every).encode())

        started = self.body_started
        return Ending(Gathering(keys.ending(cell), f"{label} (end)", flags.timeout, verdict=decide,
                                working=lambda _, last: at_work(cell, last) and _within_max_time(flags, started),
                                on_tick=lambda: _end_tick(world, cell, live, flags, started, self.turn, self.hang),
                                then=f"finished {label}"), failed=self.cut)

    def cut(self, exc: BaseException) -> None:
        """The end's wait failed on this rank: its group is not trusted, and ``exc`` carries what the ranks
        published so far (only this rank's, if it shows no table)."""
        world, cell = self.world, self.cell
        if world.pg is not None:
            world.pg.distrust(f"the end of {self.label} was not reached by every rank")
        partial = ([Capture.read(world.client.get_if(world.key(keys.out(cell, i)))) for i in range(world.world_size)]
                   if self.shows_table else [Capture.read(self.published) if i == world.rank else None
                                             for i in range(world.world_size)])  # nobody draws its table
        cut_short(exc, self.outcome(partial))

    def ended(self, opened: Verdict) -> Outcome:
        """The cell ended on every rank: every rank's capture (this rank's only, if it shows no table), why it was
        cut short, and what the process group needs."""
        world = self.world
        world.notes.write(f"finished {self.label}", cell=self.n)
        captures, found = ending.records(world, self.cell, opened, Capture.read(self.published), self.shows_table,
                                         self.every)
        outcome = self.outcome(captures)
        outcome.mismatch = found.mismatch
        distrusted = found.distrusted
        if distrusted is not None:
            if world.pg is not None:
                world.pg.distrust(distrusted)
            outcome.distrusted = distrusted
            outcome.holders = procgroup.holders(self.shell.user_ns)
        elif self.rebuilt is not None:
            outcome.holders = procgroup.holders(self.shell.user_ns)
        return outcome


def say(text: str) -> None:
    """One line for the notebook of this rank, before its table (what happened at a step)."""
    print(f"nbdist: {text}", file=sys.stderr, flush=True)


def _within_max_time(flags: Flags, started: float) -> bool:
    """Whether a rank still running its body may yet be waited for (its own watcher ends it at --max-time)."""
    return flags.max_time is None or time.monotonic() - started < flags.max_time + MAX_TIME_GRACE


def _end_tick(world: World, cell: str, live: LiveTable, flags: Flags, started: float, turn: Turn,
              hang: Any = None) -> None:
    """While this rank waits for the others at the end of the cell: a held press, the live table, --max-time,
    and where every rank is once it waits long."""
    turn.stops.check()
    live.tick()
    if hang is not None:
        hang.tick()
    if not _within_max_time(flags, started):
        running = [world.describe(i) for i in range(world.world_size)
                   if (last := world.notes.of(i)) is not None and last.body == cell]
        raise MaxTimeError(f"--max-time {flags.max_time:g} s ran out with {', '.join(running) or 'a rank'} still "
                           "running its body")


def _record(world: World, cap: Capture, checker: Checker, interrupted: bool) -> Capture:
    """What this rank publishes about its cell: the capture, its collectives, its group's state."""
    error = cap.error
    record = replace(
        cap, error=replace(error, interrupted=True) if interrupted and error is not None else error, rank=world.rank,
        collectives=dict(checker.counts), checks=checker.checks() if checker.compare else None,
        trace=trace.events(checker.events, checker.sigs) if checker.events is not None else None,
        pg=world.pg.state() if world.pg is not None else {"ok": False, "why": "no process group"})
    fit(record.as_dict())  # raises here, inside the guard, if anything cannot be published
    return record


def _is_consequence(error: Raised, checker: Checker) -> bool:
    """Whether an error followed from the cell being stopped (a refused or cut collective)."""
    if error.ename in _CONSEQUENCES or checker.failed_inside:
        return True
    return any(sign in error.evalue for sign in CUT_SIGNS)


def _capture_failure(world: World, cap: Capture, exc: BaseException) -> Capture:
    """A record for a rank whose capture could not be published, keeping what text it could."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record = Capture(
        outputs=[o for o in cap.outputs if o.get("kind") in ("stdout", "stderr")], result=None,
        error=Raised(ename="CaptureError", evalue=f"nbdist could not capture this rank's output: {exc}",
                     traceback=capture.truncate(text), short=capture.truncate(text)),
        wall=float(cap.wall), rank=world.rank, collectives={}, pg={"ok": False, "why": "its capture failed"})
    json.dumps(record.as_dict())
    return record
