"""One explored run: the ranks' threads, the gates they stop at, and the scheduler that lets one through at a time.

A rank's thread runs freely between store operations and stops at each one (:meth:`Scheduler.operate`) until
granted. The controller (the caller of :meth:`Scheduler.run`) decides only at quiescence, when no rank thread
is running: every one is at a gate, blocked in a wait, waiting to re-run (``later``) or finished. Then, in
order:

1. a blocked rank whose keys are set is woken (eagerly: a wake-up does no store operation, so no ordering is
   lost; its next operation is a gate like any other);
2. else one rank at a gate is granted, chosen by the chooser (a choice point), and with it, where the
   scenario allows, an event (another choice point): the stop button just before the operation (``b``) or just
   after it (``a``), a stop that nbdist sends (a :class:`~nbdist.errors.StopRequest`, which a watcher raises
   through the kernel's stopper) just before (``B``) or just after it (``A``), the rank's kernel killed
   (``k``), or the rank stalled just before it for :data:`STALL` virtual seconds (``s``: a kernel that a loaded
   machine or a person in its debugger holds up, while the others' clocks run);
3. else a rank waiting to re-run (``later``: a person re-runs a cell once the others have settled, none held up)
   goes on;
4. else virtual time moves to the next tick of a blocked rank (its ``on_tick`` runs; past its deadline the wait
   raises ``WaitTimeout``), beating each live rank's heartbeat as the pulse would once a virtual second; a wait
   still blocked after :data:`HANG_AFTER` never ends, and the run ends it with :class:`~.gate.Hung`;
5. else every rank has finished: the phase is over.

A switch away from a rank that could go on counts as a preemption; with a ``bound``, a choice point offers no
switch once the run has used that many.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time as real_time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from nbdist.errors import StoppedError
from nbdist.world.store import StoreClient

from .clock import EPOCH, START, VirtualClock
from .gate import Hung, Killed

RUNNING, GATE, BLOCKED, LATER, DONE = "running", "at a gate", "blocked", "later", "done"
RUN, BEFORE, AFTER, KILL = ".", "b", "a", "k"  # what a grant says: go on, stop before, stop after, kill
SENT_BEFORE, SENT_AFTER = "B", "A"  # a stop nbdist sends (StoppedError through the stopper), before or after
STALLED = "s"  # the rank is held up just before the operation, its heartbeat beating on
STALL = 5.0  # virtual seconds a stall lasts: past a scenario's timeout and a recheck of who is missing
_ABORT, _HUNG = "abort", "hung"
WRITES = frozenset({"set", "add", "compare_set", "append", "delete"})
WATCHDOG = 20.0  # real seconds a rank may run between two gates before the run counts as stuck
HANG_AFTER = 120.0  # virtual seconds (60 of the scenarios' timeouts) after which a wait counts as one that never ends
EVENT_NAMES = {BEFORE: "stop before", AFTER: "stop after", KILL: "killed at", SENT_BEFORE: "sent a stop before",
               SENT_AFTER: "sent a stop after", STALLED: "stalled at"}
LANDS_BEFORE, LANDS_AFTER = (BEFORE, SENT_BEFORE), (AFTER, SENT_AFTER)


class HarnessError(RuntimeError):
    """The explorer itself went wrong (a rank stuck outside the gates, a run that did not repeat itself)."""


class Chooser(Protocol):
    def choose(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        """One of ``options``: a rank ("0", "1", ...) when ``kind`` is "rank"; an event (".", "b", "a", "B", "A",
        "k") when it is "event", for ``rank`` at its gate number ``gate``."""
        ...


@dataclass(frozen=True)
class Step:
    """One granted store operation: the trace's line."""

    vt: float
    rank: int
    op: str
    key: str
    action: str
    tick: bool

    def __str__(self) -> str:
        mark = "" if self.action == RUN else f"   <- {EVENT_NAMES[self.action].removesuffix(' at')}"
        return f"{self.vt:6.1f}  rank {self.rank}  {self.op} {self.key}{' (tick)' if self.tick else ''}{mark}"


@dataclass(frozen=True)
class Wait:
    rank: int
    keys: tuple[str, ...]
    start: float
    end: float
    seconds: float
    how: str  # "ready", "timeout", or "raised" (a tick raised, or the rank was stopped)


@dataclass(frozen=True)
class Write:
    vt: float
    rank: int
    op: str
    key: str
    args: tuple[Any, ...]
    result: Any


@dataclass(frozen=True)
class Event:
    vt: float
    rank: int
    gate: int  # the rank's gate number (its store operations outside ticks, from 0)
    op: str
    key: str
    action: str

    def __str__(self) -> str:
        return f"rank {self.rank} {EVENT_NAMES[self.action]} its gate {self.gate} ({self.op} {self.key})"


@dataclass(frozen=True)
class Outcome:
    """How a rank's program ended: its value, or the exception it raised; when (virtual s); whether killed."""

    value: Any
    error: BaseException | None
    end: float
    killed: bool = False

    def __str__(self) -> str:
        if self.killed:
            return "killed"
        if self.error is None:
            return f"returned {self.value!r}"
        return f"{type(self.error).__name__}: {self.error}"


@dataclass
class _Rank:
    rank: int
    status: str = RUNNING
    op: tuple[str, str] = ("", "")
    grant: str | None = None
    keys: list[str] = field(default_factory=list)
    until: float = 0.0
    since: float = 0.0  # when the wait it is blocked in began
    fresh: bool = False
    wake: str | None = None
    in_tick: bool = False
    killed: bool = False
    stalled: bool = False  # held up (``s``): the others have not settled
    gates: int = 0
    offered: set[int] = field(default_factory=set)  # the gates where the scenario offered an event


class Scheduler:
    """The gates of one run's ranks (called from their threads) and the controller that decides (:meth:`run`)."""

    def __init__(self, clock: VirtualClock, control: StoreClient, sessions: list[str], short: Callable[[str], str]):
        self.clock, self.control, self.sessions, self.short = clock, control, sessions, short
        self.cv = threading.Condition()
        self.ranks = [_Rank(i, status=DONE) for i in range(len(sessions))]
        self.trace: list[Step] = []
        self.waits: list[Wait] = []
        self.writes: list[Write] = []
        self.events: list[Event] = []
        self.chooser: Chooser | None = None
        self.bound: int | None = None
        self.allowed: Callable[[int, str, str], str] | None = None
        self.events_left = 0
        self.prev: int | None = None
        self.preemptions = 0
        self.aborted = False
        self._dirty = False
        self._beats = [0] * len(sessions)
        self._local = threading.local()
        self.stop_buttons: dict[int, Callable[[], None]] = {}  # a kernel that holds the stop button presses it here
        self.stoppers: dict[int, Callable[[], None]] = {}  # a kernel's stopper: a stop nbdist sends lands through it

    def phase(
        self,
        chooser: Chooser,
        bound: int | None = None,
        allowed: Callable[[int, str, str], str] | None = None,
        events: int = 0,
    ) -> None:
        """How the next :meth:`run` chooses: ``allowed(rank, op, key)`` names the events offered at a gate."""
        self.chooser, self.bound, self.allowed, self.events_left = chooser, bound, allowed, events
        self.prev, self.preemptions = None, 0

    # --- the ranks' side ----------------------------------------------------------------------------------------
    def operate(self, rank: int, op: str, key: str, args: tuple[Any, ...], fn: Callable[[], Any]) -> Any:
        """Run one store operation of ``rank`` once granted; a stop lands before or after it."""
        action = self._gate(rank, op, key)
        if action in LANDS_BEFORE:
            self.land(rank, action)
        if action == STALLED:
            self.stall(rank)
        result = fn()
        if op in WRITES:
            self.writes.append(Write(self.clock.elapsed, rank, op, self.short(key), args, result))
        if action in LANDS_AFTER:
            self.land(rank, action)
        return result

    def land(self, rank: int, action: str) -> None:
        """A stop lands on ``rank``: its stop button (``b``, ``a``), or a stop nbdist sends (``B``, ``A``)."""
        if action in (BEFORE, AFTER):
            self.press(rank)
            return
        stopper = self.stoppers.get(rank)
        if stopper is None:
            raise StoppedError("stopped by nbdist stop in a terminal")
        stopper()

    def press(self, rank: int) -> None:
        """The stop button of ``rank``: KeyboardInterrupt, unless its kernel handles the press (``stop_buttons``)."""
        button = self.stop_buttons.get(rank)
        if button is None:
            raise KeyboardInterrupt
        button()

    def restart(self, rank: int, session: str) -> None:
        """``rank``'s killed kernel starts again as ``session``, on the thread of its program: it passes gates again,
        and beats under its new session (the old one's last beat says gone)."""
        with self.cv:
            st = self.ranks[rank]
            assert st.killed, f"rank {rank} was not killed"
            st.killed = False
            self.sessions[rank] = session
            self._beat(rank)

    def enter_wait(self, rank: int, keys: list[str]) -> str | None:
        """The gate of a wait; the stop to land just after it ends (its action), if any."""
        action = self._gate(rank, "wait", ",".join(keys))
        if action == STALLED:
            self.stall(rank)
        self.ranks[rank].since = self.clock.now
        if action in LANDS_BEFORE:
            self.land(rank, action)
        return action if action in LANDS_AFTER else None

    def block(self, rank: int, keys: list[str], until: float) -> str:
        """Block ``rank`` until ``keys`` are set ("ready") or virtual time reaches ``until`` ("tick")."""
        st = self.ranks[rank]
        with self.cv:
            st.keys, st.until, st.fresh, st.wake, st.status = keys, until, True, None, BLOCKED
            return self._park(st)

    def left_wait(self, rank: int, keys: list[str], start: float, seconds: float, how: str) -> None:
        self.waits.append(
            Wait(rank, tuple(self.short(k) for k in keys), start - START, self.clock.elapsed, seconds, how)
        )

    @contextlib.contextmanager
    def ticking(self, rank: int) -> Iterator[None]:
        """The rank's gates inside this block are a wait's tick: no event lands there."""
        self.ranks[rank].in_tick = True
        try:
            yield
        finally:
            self.ranks[rank].in_tick = False

    def later(self, rank: int) -> None:
        """Go on once no other rank can run without virtual time passing (a person re-runs a cell later)."""
        st = self.ranks[rank]
        with self.cv:
            st.status, st.wake = LATER, None
            self._park(st)

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` in a rank's thread: blocked on nothing until virtual time has moved ``seconds``."""
        rank = self._local.rank
        st = self.ranks[rank]
        with self.cv:
            st.keys, st.until, st.fresh, st.wake, st.status = [], self.clock.now + seconds, False, None, BLOCKED
            st.since = self.clock.now
            self._park(st)

    def stall(self, rank: int) -> None:
        """``rank`` is held up for :data:`STALL` virtual seconds; no person re-runs a cell meanwhile (``later``)."""
        self.ranks[rank].stalled = True
        try:
            self.sleep(STALL)
        finally:
            self.ranks[rank].stalled = False

    def _gate(self, rank: int, op: str, key: str) -> str:
        st = self.ranks[rank]
        with self.cv:
            if st.killed or self.aborted:
                raise Killed()
            st.op, st.grant, st.status = (op, self.short(key)), None, GATE
            self.cv.notify_all()
            while st.grant is None:
                self.cv.wait()
            action, st.grant = st.grant, None
        if action in (KILL, _ABORT):
            raise Killed()
        return action

    def _park(self, st: _Rank) -> str:
        """Wait (holding the condition) until the controller wakes ``st``; returns why."""
        self.cv.notify_all()
        while st.wake is None:
            self.cv.wait()
        wake, st.wake = st.wake, None
        if wake == _ABORT:
            raise Killed()
        if wake == _HUNG:
            raise Hung(f"still waiting after {HANG_AFTER:g} virtual s for {', '.join(map(self.short, st.keys))}")
        return wake

    # --- the controller -----------------------------------------------------------------------------------------
    def start_beats(self) -> None:
        for i in range(len(self.sessions)):
            self._beat(i)

    def run(self, programs: dict[int, Callable[[], Any]]) -> dict[int, Outcome]:
        """Run each rank's program in its thread until every one has finished; their outcomes."""
        outcomes: dict[int, Outcome] = {}

        def target(i: int, program: Callable[[], Any]) -> None:
            self._local.rank = i
            try:
                outcomes[i] = Outcome(program(), None, self.clock.elapsed)
            except BaseException as exc:  # the rank's own ending: the scenario judges it
                outcomes[i] = Outcome(None, exc, self.clock.elapsed, self.ranks[i].killed)
            finally:
                with self.cv:
                    self.ranks[i].status = DONE
                    self.cv.notify_all()

        threads = []
        with self.cv:
            for i in programs:
                st = self.ranks[i]
                st.status, st.grant, st.wake, st.in_tick = RUNNING, None, None, False
        for i, program in programs.items():
            thread = threading.Thread(target=target, args=(i, program), name=f"explore-rank-{i}", daemon=True)
            threads.append(thread)
            thread.start()
        try:
            self._drive()
        except BaseException:
            self._abort(threads)
            raise
        for thread in threads:
            thread.join(WATCHDOG)
        return outcomes

    def _drive(self) -> None:
        while True:
            self._quiesce()
            with self.cv:
                if self._wake_ready():
                    continue
                gated = [st.rank for st in self.ranks if st.status == GATE]
                if gated:
                    self._grant(gated)
                    continue
                later = [st for st in self.ranks if st.status == LATER]
                if later and not any(st.stalled for st in self.ranks):
                    self._wake(later[0], "later")
                    continue
                blocked = [st for st in self.ranks if st.status == BLOCKED]
                if not blocked:
                    return
                self._tick(min(blocked, key=lambda st: (st.until, st.rank)))

    def _quiesce(self) -> None:
        deadline = real_time.monotonic() + WATCHDOG
        with self.cv:
            while running := [st.rank for st in self.ranks if st.status == RUNNING]:
                left = deadline - real_time.monotonic()
                if left <= 0:
                    raise HarnessError(
                        f"rank(s) {running} ran {WATCHDOG:g} s without reaching a store operation "
                        "(a call that blocks outside the gates?)"
                    )
                self.cv.wait(left)

    def _wake_ready(self) -> bool:
        woke = False
        for st in self.ranks:
            if st.status == BLOCKED and st.keys and (self._dirty or st.fresh):
                st.fresh = False
                if self.control.check(st.keys):
                    self._wake(st, "ready")
                    woke = True
        self._dirty = False
        return woke

    def _grant(self, gated: list[int]) -> None:
        assert self.chooser is not None
        prev = self.prev
        if prev in gated:
            may_switch = self.bound is None or self.preemptions < self.bound
            options = [prev, *(i for i in gated if i != prev and may_switch)]
        else:
            options = gated
        choice = options[0]
        if len(gated) > 1:  # a choice point even where the bound leaves one option: schedules do not depend on it
            choice = int(self.chooser.choose("rank", [str(i) for i in options], -1, -1))
        if prev in gated and choice != prev:
            self.preemptions += 1
        self.prev = choice
        st = self.ranks[choice]
        op, key = st.op
        action = RUN
        allowed = self.allowed(choice, op, key) if not st.in_tick and self.allowed is not None else ""
        if allowed:
            st.offered.add(st.gates)
        if allowed and self.events_left > 0:
            action = self.chooser.choose("event", [RUN, *allowed], choice, st.gates)
        self.trace.append(Step(self.clock.elapsed, choice, op, key, action, st.in_tick))
        if action != RUN:
            self.events_left -= 1
            self.events.append(Event(self.clock.elapsed, choice, st.gates, op, key, action))
        if not st.in_tick:
            st.gates += 1
        if action == KILL:
            st.killed = True
            self._beat(choice, gone=True)
        if op in WRITES:
            self._dirty = True
        st.grant, st.status = action, RUNNING
        self.cv.notify_all()

    def _tick(self, st: _Rank) -> None:
        if st.until - st.since > HANG_AFTER:  # the rank waits for something that never comes: end its wait
            self._wake(st, _HUNG)
            return
        before = self.clock.now
        self.clock.advance(st.until)
        if math.floor(self.clock.now - START) > math.floor(before - START):  # a whole virtual second went by
            for i, other in enumerate(self.ranks):
                if not other.killed:
                    self._beat(i)
        self._wake(st, "tick")

    def _wake(self, st: _Rank, why: str) -> None:
        st.wake, st.status = why, RUNNING
        self.cv.notify_all()

    def _beat(self, i: int, gone: bool = False) -> None:
        """Rank ``i``'s heartbeat, as its pulse writes it (nbdist.world.pulse.beat_for)."""
        self._beats[i] += 1
        beat = {
            "n": self._beats[i],
            "t": EPOCH + self.clock.elapsed,
            "pid": 100 + i,
            "pulse": 200 + i,
            "rank": i,
            "busy": 0.0,
            **({"gone": True} if gone else {}),
        }
        self.control.set(f"hb/{self.sessions[i]}", json.dumps(beat))

    def _abort(self, threads: list[threading.Thread]) -> None:
        """End a run that went wrong: every parked rank raises Killed; wait a little for the threads."""
        with self.cv:
            self.aborted = True
            for st in self.ranks:
                st.grant = st.wake = _ABORT
            self.cv.notify_all()
        for thread in threads:
            thread.join(2.0)
