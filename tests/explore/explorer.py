"""Exploring a scenario's interleavings: the store every run uses, the choosers, and the three ways to explore.

- :func:`exhaustive`: every schedule within a preemption bound, depth first, each run re-executed from
  scratch up to its last choice point (stateless, as CHESS does); with 2 ranks.
- :func:`randomly`: one run per seed, every choice drawn from it, and one event planned on a random rank at
  a random gate; with 3 ranks (or more).
- :func:`replay`: one run, from the schedule string a failing run printed.

A schedule is the string of a run's choices in order: a digit for the rank that was let through where more
than one could go, and at each gate where an event was on offer ``.`` (none), ``b``/``a`` (the stop button
just before or just after the operation), ``B``/``A`` (a stop that nbdist sends, the same) or ``k`` (the kernel
killed).
"""

from __future__ import annotations

import contextlib
import random
import time as real_time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from nbdist.world import gather, keys
from nbdist.world.counters import TURN, current_round
from nbdist.world.records import Arrival, Registration
from nbdist.world.store import Server, StoreClient, connect
from nbdist.world.verdict import Verdict
from nbdist.world.world import World

from .clock import FakeTime, VirtualClock, patched
from .gate import GatedClient
from .scheduler import RUN, Event, HarnessError, Outcome, Scheduler, Step, Wait, Write

HOST = "127.0.0.1"
RANDOM_GATES = 16  # a random run's planned event lands at one of a rank's first this many gates


@dataclass(frozen=True)
class Hooks:
    """What a scenario's program may ask of the harness, besides its rank's World."""

    rank: int
    timeout: float
    scheduler: Scheduler

    def later(self) -> None:
        """Go on once every other rank waits or has finished: a person re-running a cell a moment later."""
        self.scheduler.later(self.rank)

    def restart(self, session: str) -> None:
        """This rank's killed kernel starts again, as a new ``session`` (its program goes on from the kill)."""
        self.scheduler.restart(self.rank, session)

    def on_stop(self, button: Callable[[], None]) -> None:
        """What the stop button does on this rank (by default it raises KeyboardInterrupt where it lands)."""
        self.scheduler.stop_buttons[self.rank] = button

    def on_sent_stop(self, stopper: Callable[[], None]) -> None:
        """What a stop that nbdist sends does on this rank (by default it raises StoppedError where it lands)."""
        self.scheduler.stoppers[self.rank] = stopper


@dataclass(frozen=True)
class Rejoined:
    """A rank's program that ends by re-running ``%%dist_init``: how its cell ended (its value, the exception it
    ended with, or None: it ran none) and when (virtual s; it left its round then), and the world it joined (the
    follow-up meets there)."""

    cell: object
    ended: float
    world: World
    then: object = None  # its next cell there, if the scenario runs one


@dataclass(frozen=True)
class Scenario:
    """A program every rank runs (each with its own World), the events on offer, and the checks of a run."""

    name: str
    ranks: int
    program: Callable[[World, Hooks], Any]
    check: Callable[[Run], None]
    events: Callable[[int, str, str], str] | None = None  # (rank, op, key) -> the events offered there ("ba", "k")
    max_events: int = 1
    follow_up: bool = True  # afterwards every rank meets at the next step (no choices, no events)
    timeout: float = 2.0  # every wait's --timeout, virtual seconds
    about: str = ""
    known: str | None = None  # a finding the scenario is known to fail on, until it is fixed
    around: Callable[[], contextlib.AbstractContextManager[Any]] | None = None  # entered around each run


@dataclass
class Run:
    """What one run did: its schedule and trace, how each rank ended, its waits, writes and events."""

    scenario: str
    schedule: str
    outcomes: dict[int, Outcome]
    followup: dict[int, Outcome] | None
    trace: list[Step]
    waits: list[Wait]
    writes: list[Write]
    events: list[Event]
    worlds: list[World]
    timeout: float
    preemptions: int
    gates: dict[int, frozenset[int]]  # each rank's gates (store operations outside ticks) where events were offered

    def describe(self, rank: int) -> str:
        return self.worlds[rank].describe(rank)

    def hit(self) -> dict[int, Event]:
        """The ranks an event landed on, and the event."""
        return {e.rank: e for e in self.events}

    def report(self, why: str) -> str:
        """A failing run, to read and to replay."""
        lines = [
            f"{self.scenario}: {why}",
            f"schedule {self.schedule!r}; replay: python -m tests.explore --scenario {self.scenario} "
            f"--ranks {len(self.worlds)} --replay '{self.schedule}'",
            *(f"event: {e}" for e in self.events),
            *(f"rank {i}: {o}" for i, o in sorted(self.outcomes.items())),
            *(f"follow-up, rank {i}: {o}" for i, o in sorted((self.followup or {}).items())),
            "trace (virtual s, rank, operation, key):",
            *(f"  {line}" for line in _folded(self.trace)),
        ]
        return "\n".join(lines)


def _folded(trace: list[Step], keep: int = 8) -> Iterator[str]:
    """The trace's lines, each long run of one rank's tick operations folded into its first lines and a count."""
    i = 0
    while i < len(trace):
        j = i
        while j < len(trace) and trace[j].tick and trace[j].rank == trace[i].rank:
            j += 1
        if j - i > 2 * keep:
            yield from (str(step) for step in trace[i : i + keep])
            yield f"   ... {j - i - keep} more tick operations of rank {trace[i].rank}, until {trace[j - 1].vt:.1f} s"
            i = j
        else:
            yield str(trace[i])
            i += 1


class Lab:
    """One real server on loopback, a connection per simulated rank and one for the scheduler; a round per run."""

    def __init__(self, port: int = 0, ranks: int = 3) -> None:
        self.server = Server(HOST, port)
        made: list[StoreClient] = []
        try:
            for _ in range(ranks + 1):
                made.append(connect(HOST, self.server.port))
        except BaseException:
            for client in made:
                client.close()
            self.server.stop()
            raise
        self.control, *self.clients = made
        self.rounds = 0
        self.clock = VirtualClock()

    def close(self) -> None:
        """Idempotent."""
        for client in [self.control, *self.clients]:
            client.close()
        self.server.stop()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def follow_up(world: World, timeout: float, meet: bool) -> tuple[int, Verdict | None]:
    """After a scenario: the step this rank's next cell takes, and (with ``meet``) how its meeting opened."""
    n = world.turns.next()
    if not meet:
        return n, None
    return n, gather.meet(world, n, Arrival("barrier", f"follow-up #{n}"), timeout)


def execute(lab: Lab, scenario: Scenario, chooser: Recorder, bound: int | None = None) -> Run:
    """One run of ``scenario`` in a fresh round, its choices made by ``chooser``."""
    if scenario.ranks > len(lab.clients):
        raise HarnessError(f"{scenario.name} needs {scenario.ranks} ranks; the lab has {len(lab.clients)}")
    lab.rounds = max(lab.rounds, current_round(lab.control)) + 1  # past any round a re-run %%dist_init opened
    k, n = lab.rounds, scenario.ranks
    infos = [Registration(session=f"explore-{k}-{i}", rank=i, host="h", pid=100 + i) for i in range(n)]
    lab.control.set("round", str(k))  # World.checks.world reads it: this round is the current one
    lab.clock.reset()
    prefix, session = f"r/{k}/", f"explore-{k}-"
    scheduler = Scheduler(
        lab.clock,
        lab.control,
        [info.session for info in infos],
        short=lambda key: key.replace(prefix, "").replace(session, "rank"),
    )
    worlds = [World(GatedClient(lab.clients[i], i, scheduler), k, i, n, infos[i], infos) for i in range(n)]
    for i, info in enumerate(infos):  # each rank's registration, which a rank re-reads when the world moves on
        lab.control.set(worlds[0].key(keys.rank(i)), info.to_json())
    for name, value in ((keys.SIZE, str(n)), (keys.JOINED, "".join(f"{i}," for i in range(n))), (keys.READY, "1")):
        lab.control.set(worlds[0].key(name), value)  # formed, as nbdist.world.rendezvous.join leaves a round
    lab.control.add(worlds[0].key(keys.COUNT), n)
    lab.control.add(worlds[0].key(TURN), 0)  # the world formed: each rank read turns.next() as it joined
    for world in worlds:
        world.last_turn = 0  # just joined: step 1 is this round's first
    hooks = [Hooks(i, scenario.timeout, scheduler) for i in range(n)]
    scheduler.start_beats()
    around = contextlib.nullcontext() if scenario.around is None else scenario.around()
    with patched(FakeTime(lab.clock, scheduler.sleep)), around:
        scheduler.phase(chooser, bound, scenario.events, scenario.max_events if scenario.events else 0)
        outcomes = scheduler.run({i: partial(scenario.program, worlds[i], hooks[i]) for i in range(n)})
        preemptions, gates = scheduler.preemptions, {st.rank: frozenset(st.offered) for st in scheduler.ranks}
        followup = None
        if scenario.follow_up:
            alive = [i for i in range(n) if not outcomes[i].killed]
            scheduler.phase(FIRST)
            meet = len(alive) == n  # a world with a dead rank cannot meet; its ranks must still agree on the step
            after = {i: value.world if isinstance(value := outcomes[i].value, Rejoined) else worlds[i] for i in alive}
            followup = scheduler.run({i: partial(follow_up, after[i], scenario.timeout, meet) for i in alive})
    return Run(
        scenario.name,
        chooser.schedule(),
        outcomes,
        followup,
        scheduler.trace,
        scheduler.waits,
        scheduler.writes,
        scheduler.events,
        worlds,
        scenario.timeout,
        preemptions,
        gates,
    )


# --- choosers ---------------------------------------------------------------------------------------------------


class Recorder:
    """A chooser that remembers what it chose, as the run's schedule string."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def choose(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        value = self.pick(kind, options, rank, gate)
        self.made.append(value)
        return value

    def pick(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        raise NotImplementedError

    def schedule(self) -> str:
        return "".join(self.made)


class _First(Recorder):
    """The first option always (the follow-up: no choices), remembering nothing."""

    def choose(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        return options[0]


FIRST = _First()


class Depth(Recorder):
    """Follows ``prefix`` (option indices), then takes the first option; records every choice point's size."""

    def __init__(self, prefix: list[int]) -> None:
        super().__init__()
        self.prefix = prefix
        self.points: list[tuple[int, int]] = []  # (chosen index, number of options)

    def pick(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        at = len(self.points)
        index = self.prefix[at] if at < len(self.prefix) else 0
        if index >= len(options):
            raise HarnessError(
                f"the run did not repeat itself: choice {at} has {len(options)} options, not "
                f"{index + 1} (something outside the gates decides)"
            )
        self.points.append((index, len(options)))
        return options[index]

    def next_prefix(self) -> list[int] | None:
        """The next schedule depth first (the deepest choice point with an option left), or None when done."""
        points = list(self.points)
        while points and points[-1][0] + 1 >= points[-1][1]:
            points.pop()
        if not points:
            return None
        return [i for i, _ in points[:-1]] + [points[-1][0] + 1]


class Seeded(Recorder):
    """Every rank choice drawn from ``seed``; one event, planned up front on a random rank at a random gate."""

    def __init__(self, seed: int, ranks: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.plan = (self.rng.randrange(ranks), self.rng.randrange(RANDOM_GATES), self.rng.random())

    def pick(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        if kind == "rank":
            return self.rng.choice(options)
        target, at, x = self.plan
        if (rank, gate) != (target, at):
            return RUN
        events = options[1:]
        return events[int(x * len(events))]


class Replay(Recorder):
    """The choices of a schedule string, one character each."""

    def __init__(self, schedule: str) -> None:
        super().__init__()
        self.rest = list(schedule)

    def pick(self, kind: str, options: list[str], rank: int, gate: int) -> str:
        if not self.rest:
            raise HarnessError(f"the schedule ends before the run does (at {''.join(self.made)!r}; options {options})")
        value = self.rest.pop(0)
        if value not in options:
            raise HarnessError(
                f"the schedule does not fit this run: {value!r} after {''.join(self.made)!r}, "
                f"where the options are {options}"
            )
        return value


# --- exploring ----------------------------------------------------------------------------------------------------


@dataclass
class Failure:
    number: int  # the run that found it, from 1
    run: Run
    why: str

    def __str__(self) -> str:
        return f"run {self.number}: {self.run.report(self.why)}"


@dataclass
class Result:
    """What an exploration did: how many interleavings, whether it exhausted its bound, what failed."""

    scenario: str
    mode: str
    runs: int = 0
    exhausted: bool = False
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    schedules: set[str] = field(default_factory=set)
    stops: set[tuple[int, int, str]] = field(default_factory=set)  # (rank, gate, event) of every event that fired
    bound: int | None = None
    passed: dict[int, set[int]] = field(default_factory=dict)  # per rank, gates with events on offer that runs passed

    @property
    def distinct(self) -> int:
        return len(self.schedules)

    def unstopped(self, events: str) -> list[tuple[int, int, str]]:
        """(rank, gate, event) of each gate a run without an event passed where ``events`` never fired: empty
        when the exploration put each event offered everywhere at every gate."""
        return [
            (rank, gate, e)
            for rank, offered in sorted(self.passed.items())
            for gate in sorted(offered)
            for e in events
            if (rank, gate, e) not in self.stops
        ]

    def summary(self) -> str:
        within = "" if self.bound is None else f" within {self.bound} preemption(s)"
        how = {
            "exhaustive": f"every one{within}" if self.exhausted else f"stopped before the end{within}",
            "random": f"{self.distinct} distinct",
        }.get(self.mode, self.mode)
        found = f"{len(self.failures)} failing" + (
            f" (first at run {self.failures[0].number})" if self.failures else ""
        )
        return f"{self.scenario}: {self.runs} interleavings explored ({how}), {found}, {self.seconds:.1f} s"


def check(scenario: Scenario, run: Run) -> str | None:
    """Why the run broke the scenario's invariants, or None."""
    from .invariants import Violation

    try:
        scenario.check(run)
    except Violation as exc:
        return str(exc)
    return None


def _note(result: Result, run: Run) -> None:
    result.runs += 1
    result.schedules.add(run.schedule)
    result.stops.update((e.rank, e.gate, e.action) for e in run.events)
    if not run.events:
        for rank, gates in run.gates.items():
            result.passed.setdefault(rank, set()).update(gates)


def exhaustive(
    lab: Lab,
    scenario: Scenario,
    bound: int | None,
    cap: int | None = None,
    keep_going: bool = False,
    progress: Callable[[Result], None] | None = None,
) -> Result:
    """Every schedule of ``scenario`` with at most ``bound`` preemptions (None: every one), depth first."""
    result = Result(scenario.name, "exhaustive", bound=bound)
    started = real_time.monotonic()
    prefix: list[int] | None = []
    while prefix is not None:
        chooser = Depth(prefix)
        run = execute(lab, scenario, chooser, bound)
        _note(result, run)
        why = check(scenario, run)
        if why is not None:
            result.failures.append(Failure(result.runs, run, why))
            if not keep_going:
                break
        prefix = chooser.next_prefix()
        if prefix is None:
            result.exhausted = True
        elif cap is not None and result.runs >= cap:
            break
        if progress is not None and result.runs % 500 == 0:
            progress(result)
    result.seconds = real_time.monotonic() - started
    return result


def randomly(
    lab: Lab,
    scenario: Scenario,
    seeds: Iterable[int],
    keep_going: bool = False,
    progress: Callable[[Result], None] | None = None,
) -> Result:
    """One run per seed (see :class:`Seeded`)."""
    result = Result(scenario.name, "random")
    started = real_time.monotonic()
    for seed in seeds:
        run = execute(lab, scenario, Seeded(seed, scenario.ranks))
        _note(result, run)
        why = check(scenario, run)
        if why is not None:
            result.failures.append(Failure(result.runs, run, f"seed {seed}: {why}"))
            if not keep_going:
                break
        if progress is not None and result.runs % 500 == 0:
            progress(result)
    result.seconds = real_time.monotonic() - started
    return result


def replay(lab: Lab, scenario: Scenario, schedule: str) -> tuple[Run, str | None]:
    """The run of ``schedule`` again, and why it breaks the invariants (None if it does not)."""
    chooser = Replay(schedule)
    run = execute(lab, scenario, chooser)
    if chooser.rest:
        raise HarnessError(f"the run ended with {''.join(chooser.rest)!r} of the schedule left")
    return run, check(scenario, run)
