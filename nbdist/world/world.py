"""A formed world, seen from one rank: its steps in lockstep, barriers, liveness of the others, generations.

Every step the ranks take together (a ``%%collective``, a ``%dist_barrier``, a
rebuild of the process group for a plain cell's collective) is a numbered
*turn*. The number is the store's (``r/<r>/turn``: the last turn taken), never
a count one rank keeps: a rank reads it at its next step and meets the others
at ``t/<n>`` (:meth:`World.meet`). A turn is taken when its meeting opens or is
closed, and whoever opens or closes it moves the counter on before saying so.
So a rank whose step was stopped before it began, or that missed steps, meets
the others at the next one, and no stop can put the ranks' numbering out of
step. A follower meets at the number its driver sent, which is the driver's.

The process groups are rebuilt whenever they fail (a rank raised, was
interrupted, died and was replaced): each rebuild is a *generation*, counted in
``r/<r>/gen``; a rank whose group is of an older generation rebuilds it with
the others at its next step that uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import HEARTBEAT_INTERVAL
from ..errors import JoinError, PeerFailedError, PeerLostError, StoreConnectionError, WaitTimeout, WorldChangedError
from ..ranksets import who_said
from . import keys, meeting, records
from . import verdict as verdicts
from .meeting import Cause, Leave, Next, Seen
from .pulse import Beat, beat_from, judge
from .records import Arrival, Busy, MalformedRecord, Note, Registration
from .store import StoreClient
from .verdict import Verdict

TURN = keys.TURN  # the last step the world took (see the module docstring)
DEAD_AFTER = 5 * HEARTBEAT_INTERVAL  # seconds without a heartbeat before a rank counts as gone
WORKING_RECHECK = 1.0  # seconds between looks at whether the ranks a barrier waits for are still at work
UNBOUNDED = 10.0**7  # seconds: a wait whose deadline its tick keeps


def current_round(client: StoreClient) -> int:
    text = client.get_if(keys.ROUND)
    return int(text) if text else 0


def bump_generation(client: StoreClient, key: str, seen: int | None) -> int:
    """Read a generation counter (one round trip); with ``seen``, move it past ``seen`` once."""
    current = client.add(key, 0)  # creates it as "0"
    if seen is not None and current == seen:
        client.compare_set(key, str(seen), str(seen + 1))
    return current


class BarrierRefused(Exception):
    """The last rank to arrive refused to open a barrier; the message says why (see ``verdict``)."""


class StoppedAfterOpen(KeyboardInterrupt):
    """A stop reached a barrier only after every rank had arrived: the others go on with ``verdict``.

    The stop belongs to what follows the meeting (its caller decides where it lands: a rebuild that
    every rank started must finish first). Raised only to a caller that holds it (``World.barrier``'s
    ``hold_stop``: a step's meeting); ``stop`` is what landed, to be raised as it came.
    """

    def __init__(self, verdict: Verdict, stop: KeyboardInterrupt) -> None:
        super().__init__()
        self.verdict, self.stop = verdict, stop  # ``stop``: what landed (the stop button's, or a stop nbdist sent)


class PeerTracker:
    """Which other ranks are gone, by their heartbeats as this rank's own clock sees them move.

    A kernel's heartbeat is written by its pulse (:mod:`nbdist.world.pulse`), a small
    process that beats while the kernel's process lives, even when the kernel's
    Python is busy in one long C call; the beat says how long the kernel's own
    Python has not run (``busy``), and says ``gone`` when the kernel died.
    So a rank is dead when its beat says gone, or stops moving (its host or
    network is unreachable); a beat that moves is alive, however busy.
    """

    def __init__(self, ranks: list[Registration], me: int) -> None:
        self.ranks = ranks
        self._peers = {i: r.session for i, r in enumerate(ranks) if i != me}
        self._seen: dict[int, tuple[Any, float]] = {}
        # Peers whose beat is in the store and stays there (a kernel of this version leaves its last beat when it
        # stops: Heartbeat.stop): read together, in one multi_get, which would wait for a key that is not there.
        self._kept: set[int] = set()

    def beats(self, client: StoreClient) -> dict[int, Beat | None]:
        """Each peer's beat (:func:`.pulse.beat_from`): those known to stay in one ``multi_get``, the others one by
        one until theirs is seen (one that registered without ``keeps_beat``, of the version before, every time)."""
        kept = [i for i in self._peers if i in self._kept]
        texts = client.multi_get([keys.heartbeat(self._peers[i]) for i in kept]) if kept else []
        beats = {i: beat_from(t) for i, t in zip(kept, texts, strict=True)}
        for i, session in self._peers.items():
            if i not in beats:
                text = client.get_if(keys.heartbeat(session))
                if text is not None and self.ranks[i].keeps_beat:
                    self._kept.add(i)
                beats[i] = beat_from(text)
        return beats

    def dead(self, client: StoreClient) -> list[tuple[int, str]]:
        """(rank, why) of the ranks that are gone or unreachable."""
        now = time.monotonic()
        gone = []
        for i, beat in self.beats(client).items():
            n = None if beat is None else beat.n
            last_n, since = self._seen.get(i, (n, now))
            if n != last_n or i not in self._seen:
                since = now
            self._seen[i] = (n, since)
            state, seconds = judge(beat, now - since, DEAD_AFTER)
            if state == "gone":
                what = "its nbdist follow process" if self.ranks[i].process == "nbdist follow" else "its kernel"
                gone.append((i, f"is gone: {what} exited or was killed"))
            elif state == "dead":
                gone.append((i, f"stopped responding: no heartbeat for {seconds:.0f} s (its kernel, host or "
                                "network went away)"))
        return gone


def read_ranks(texts: list[str], before: list[Registration] | None = None) -> list[Registration]:
    """Each rank's registration, from its slot's text in a formed round. A slot that holds something else (anyone
    can write into the store) keeps the registration read ``before``; with none, the join fails naming it."""
    ranks = []
    for i, text in enumerate(texts):
        try:
            ranks.append(Registration.from_json(text))
        except MalformedRecord as exc:
            if before is None or i >= len(before):
                raise JoinError(f"rank {i}'s slot in the store holds no registration ({exc}): "
                                f"{records.shown(text)}; run %%dist_init again in every notebook") from None
            ranks.append(before[i])
    return ranks


@dataclass
class World:
    """One rank's membership of a formed round."""

    client: StoreClient
    round: int
    rank: int
    world_size: int
    me: Registration
    ranks: list[Registration] = field(default_factory=list)
    gen: int = 0
    replaced: Registration | None = None  # the registration this rank took over, if any
    pg: Any = None  # the ProcessGroup of the current generation, once built
    last_turn: int | None = None  # the last step this rank met the others at
    attend: Callable[[], None] | None = None  # called as this rank waits in the main thread (a driven rank's debugger)
    _next_round_check: float = 0.0
    _next_peer_check: float = 0.0
    _tracker: PeerTracker | None = None
    _noted: set[int] = field(default_factory=set)  # ranks seen to have a note (last/<i>): it is never taken back

    def registrations(self) -> list[dict[str, Any]]:
        """Each rank's registration as its JSON object (for the pure parts that take one: views, plans, checks)."""
        return [info.as_dict() for info in self.ranks]

    def key(self, name: str) -> str:
        """``name`` (built by :mod:`nbdist.world.keys`) in this world's round."""
        return keys.in_round(self.round, name)

    def describe(self, i: int) -> str:
        info = self.ranks[i] if i < len(self.ranks) else None
        return f"rank {i} ({info.host}, pid {info.pid})" if info is not None else f"rank {i} (?, pid ?)"

    # --- generations -----------------------------------------------------
    def store_generation(self) -> int:
        return bump_generation(self.client, self.key(keys.GEN), None)

    def bump_generation(self, seen: int) -> None:
        """Ask every rank to rebuild the process group at its next cell (once per failure)."""
        bump_generation(self.client, self.key(keys.GEN), seen)

    def enter_generation(self, gen: int) -> None:
        """Take ``gen`` as this world's generation and re-read the registrations (a rank may have been replaced)."""
        self.gen = gen
        names = [self.key(keys.rank(i)) for i in range(self.world_size)]
        self.ranks = read_ranks(self.client.multi_get(names), self.ranks)
        self._tracker = None

    # --- steps in lockstep ------------------------------------------------
    def turn(self) -> int:
        """The number of the world's next step (one round trip; see the module docstring)."""
        return self.client.add(self.key(TURN), 0) + 1

    def take_turn(self, n: int) -> None:
        """Move the world past step ``n``; idempotent, and a no-op once the world is past it."""
        self.client.compare_set(self.key(TURN), str(n - 1), str(n))

    def close_step(self, n: int, reason: str) -> Verdict | None:
        """Close step ``n``'s meeting with this rank's reason (whether or not it got there); returns its verdict."""
        self.take_turn(n)
        return self.close_barrier(keys.arrival(n), reason)

    def missed(self, n: int) -> str | None:
        """What the steps between this rank's last one and ``n`` were, if it missed any (they were closed)."""
        if self.last_turn is None or n <= self.last_turn + 1:
            return None
        first, last = self.last_turn + 1, n - 1
        decided = verdicts.decode(self.client.get_if(self.key(keys.state(keys.arrival(last)))))
        why = decided.encode() if decided is not None else "closed"
        steps = f"step #{first}" if first == last else f"steps #{first}-#{last}"
        return (f"{steps} went by without this rank (the last: {why}); it meets the others at step #{n}, which "
                "every rank reaches next")

    def meet(self, n: int, arrival: Arrival, timeout: float,
             verdict: Callable[[list[Arrival]], Verdict] | None = None,
             on_tick: Callable[[], None] | None = None,
             working: Callable[[int, Note | None], bool] | None = None,
             on_missed: Callable[[str], None] | None = None,
             on_arrive: Callable[[], None] | None = None) -> Verdict:
        """Meet every rank at step ``n``; returns the verdict it opened with (see :meth:`barrier`).

        ``arrival`` says what step this rank reached (its kind: "cell", "barrier", "rebuild", and its label):
        ranks that reach different kinds of step ran different cells, and are refused alike, each named
        with its label. Where the kinds agree, ``verdict`` decides from every rank's arrival (in rank order),
        as the last rank to arrive reads them. ``on_missed`` is told, before the wait, of steps the world
        took without this rank (see :meth:`missed`); ``on_arrive``, once its record is in and just before
        it is counted in (it may raise: then nothing closes the meeting here, and the caller does).
        """
        name = step_name(n)
        missed = self.missed(n)
        if missed is not None and on_missed is not None:
            on_missed(missed)
        self.last_turn = n
        self.client.set(self.key(keys.record(name, self.rank)), arrival.to_json())

        def decide() -> Verdict:
            texts = self.client.multi_get([self.key(keys.record(name, i)) for i in range(self.world_size)])
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
        return self.barrier(keys.arrival(n), timeout, arrival.label, on_tick=on_tick, verdict=decide, working=working,
                            turn=n, hold_stop=True)

    # --- activity and health ----------------------------------------------
    def note(self, what: str, *, barrier: str | None = None, then: str | None = None, turn: int | None = None,
             cell: int | None = None, body: str | None = None) -> None:
        """Record what this rank is doing, for other ranks' timeouts and status (:class:`.records.Note`)."""
        note = Note(what, time.time(), barrier=barrier, then=then, turn=turn, cell=cell, body=body)
        self.client.set(self.key(keys.last(self.rank)), note.to_json())

    def note_of(self, rank: int) -> Note | None:
        """``rank``'s note as it is (None: none yet, or not a note)."""
        return Note.read(self.client.get_if(self.key(keys.last(rank))))

    def last(self, rank: int) -> Note | None:
        """What ``rank`` last recorded; a wait at a barrier that has opened since reads as passed it.

        A rank records its next activity only once it runs again, so right after a cell the
        slowest rank's record may still say it waits at the cell's end, which is over.
        """
        last = self.note_of(rank)
        if last is None or not last.barrier or not last.then:
            return last
        decided = verdicts.decode(self.client.get_if(self.key(keys.state(last.barrier))))
        return replace(last, what=last.then) if decided is not None and decided.opened else last

    def check_world(self) -> None:
        """Raise if this round was superseded or failed, or a rank left (for every wait slice)."""
        now = time.monotonic()
        if now < self._next_round_check:
            return
        self._next_round_check = now + 0.5
        latest = current_round(self.client)
        if latest != self.round:
            gone = self._gone()  # a re-run of %%dist_init leaves this round first (Session.init), then opens the next
            who = (f"{', '.join(self.describe(i) for i in gone)} left this world and %%dist_init was re-run" if gone
                   else "another notebook re-ran %%dist_init")
            raise WorldChangedError(
                f"{who} (world round {latest}, this notebook "
                f"is in round {self.round}): re-run %%dist_init here to rejoin"
            )
        error = self.client.get_if(self.key(keys.ERROR))
        if error is not None:
            raise JoinError(records.world_error(error))
        if self.client.add(self.key(keys.LEFT_N), 0) > 0:
            names = ", ".join(self.describe(i) for i in self._gone())
            raise WorldChangedError(
                f"{names} left the world (%dist_destroy or a closed notebook): re-run %%dist_init "
                "in every notebook to form a new world"
            )

    def _gone(self) -> list[int]:
        """The ranks that left this round (:meth:`leave`)."""
        return [i for i in range(self.world_size) if self.client.check([self.key(keys.left(i))])]

    def check_peers(self, client: StoreClient | None = None) -> None:
        """Raise :class:`PeerLostError` if another rank's heartbeat stopped (checked once a second)."""
        now = time.monotonic()
        if now < self._next_peer_check:
            return
        self._next_peer_check = now + HEARTBEAT_INTERVAL
        if self._tracker is None:
            self._tracker = PeerTracker(self.ranks, self.rank)
        dead = self._tracker.dead(client or self.client)
        if dead:
            raise self.lost(dead)

    def lost(self, dead: list[tuple[int, str]]) -> PeerLostError:
        who = "; ".join(f"{self.describe(i)} {why}" for i, why in dead)
        if all(self.ranks[i].process == "nbdist follow" for i, _ in dead):
            again = (f"Once a follower joins again as {'that rank' if len(dead) == 1 else 'those ranks'} (nbdist "
                     f"follow --rank {dead[0][0]} ...), this notebook carries on at its next %%collective; %dist_init "
                     "--spawn again forms a new world")
        else:
            again = ("Once its notebook runs %load_ext nbdist and its %%dist_init again (after a restart, or when "
                     "the network is back), this notebook carries on at its next %%collective")
        return PeerLostError(f"{who}. {again}")

    # --- barriers -----------------------------------------------------------
    def barrier(self, name: str, timeout: float, label: str, on_tick: Callable[[], None] | None = None,
                verdict: Callable[[], Verdict] | None = None, members: list[int] | None = None,
                working: Callable[[int, Note | None], bool] | None = None, turn: int | None = None,
                then: str | None = None, hold_stop: bool = False) -> Verdict:
        """Wait until every rank (or every one of ``members``) arrives at barrier ``name``, or fail naming who did not.

        The last rank to arrive decides with ``verdict`` (go without one;
        see :mod:`nbdist.world.verdict`): a verdict that opens it is every
        rank's return value (a go may carry what that rank found, for every
        rank to read with it); a refusal makes every rank raise
        :class:`BarrierRefused` with its reason. A rank that stops waiting
        (timeout, interrupt, a lost peer) closes it with its reason, so the
        ranks still waiting fail with that reason and a late one fails at once.

        ``working(rank, last)`` says, from a missing rank's last recorded activity,
        whether it is still working towards this barrier (running the cell's
        body, say): ``timeout`` does not count for such a rank while its
        heartbeat lives, so the wait goes on (the peer checks still end it
        when the rank dies).

        ``turn``: the barrier is the meeting of step ``turn`` (:meth:`meet`); opening or
        closing it takes that turn, before the barrier's state says so.

        ``then``: what this rank's record reads as once the barrier has opened (:meth:`last`),
        until the rank records what it does next; "passed LABEL" if not given.

        A stop that lands once every rank arrived (the others go on) belongs to what follows: with
        ``hold_stop`` it is raised as :class:`StoppedAfterOpen`, for the caller to place (a step's meeting:
        a rebuild every rank started is finished first); otherwise it is raised as it came, the stop
        button's ``KeyboardInterrupt`` or a stop nbdist sent, with its kind and message.
        """
        base = self.key(name)
        expected = self.world_size if members is None else len(members)
        try:
            # The note comes before the arrival, from every rank: once the barrier opens, every rank's note reads as
            # ``then`` (a status read before its next note), also the note of a rank that arrived just before the
            # last and had not written it yet when the others went on (a 16-rank status met "running" there).
            self.note(f"waiting at {label}", barrier=name, then=then or f"passed {label}", turn=turn)
            if meeting.arrived(self.client.add(keys.arrivals(base), 1), expected) is Next.DECIDE:
                decided = verdict() if verdict is not None else verdicts.GO
                if turn is not None:
                    self.take_turn(turn)
                state = verdicts.decode(self.client.compare_set(keys.state(base), "", decided.encode()))
            else:
                state = self._wait_open(base, name, timeout, label, on_tick, members, working, turn)
        except KeyboardInterrupt as exc:  # wherever it lands (a store call defers it): nobody may wait for this rank
            user = type(exc) is KeyboardInterrupt
            state = self._close(base, "interrupted its cell" if user else f"stopped: {exc}", turn)
            leave = meeting.leaving(Cause.STOP, state)
            if leave is Leave.STOPPED_AFTER_OPEN:
                # Every rank arrived before the stop could close it: they go on, so the stop is what follows'.
                assert state is not None
                if hold_stop:
                    raise StoppedAfterOpen(state, exc) from None
                raise
            self._note_gave_up(label, "the stop button" if user else str(exc))
            if user:  # the stop button: its message, not nbdist's frames
                exc._render_traceback_ = lambda: [f"KeyboardInterrupt: stopped waiting at {label}; the other "  # type: ignore[attr-defined]
                                                  "ranks were told"]
            raise
        if state is None:
            raise PeerFailedError(f"{label}: the meeting ended undecided; run the next cell on every rank")
        outcome = meeting.decided(state)
        if outcome is Next.REFUSED:
            raise BarrierRefused(state.why)
        if outcome is Next.CLOSED:
            raise PeerFailedError(f"{label}: {state.encode()}; run the next cell on every rank")
        return state

    def _wait_open(self, base: str, name: str, timeout: float, label: str, on_tick: Callable[[], None] | None,
                   members: list[int] | None, working: Callable[[int, Note | None], bool] | None,
                   turn: int | None) -> Verdict | None:
        """Wait until the meeting is decided; each slice checks the world, the peers and the caller's tick, and
        :func:`nbdist.world.meeting.waiting` decides what the clock means. Leaving on its own, this rank closes it."""
        deadline = time.monotonic() + timeout
        waits_for_work = working is not None

        def tick() -> None:
            nonlocal deadline
            self.check_world()
            self.check_peers()
            if on_tick is not None:
                on_tick()
            if self.attend is not None:
                self.attend()
            now = time.monotonic()
            step = meeting.waiting(Seen(None), now, deadline, waits_for_work)
            if step is Next.READ_MISSING:
                assert working is not None
                step = meeting.waiting(Seen(None, self._missing_work(name, members, working)), now, deadline,
                                       waits_for_work)
            if step is Next.RECHECK:
                deadline = now + WORKING_RECHECK  # every missing rank is still at work: look again soon
            elif step is Next.GIVE_UP:
                raise WaitTimeout(f"waited {timeout:g} s")

        try:
            while True:
                self.client.wait([keys.state(base)], UNBOUNDED, on_tick=tick)  # the tick keeps the deadline
                state = verdicts.decode(self.client.get_if(keys.state(base)))
                if state is not None:
                    return state
                # Woken with nothing set: torch's TCPStore also wakes a wait when another client's
                # compare-and-set merely reads the missing key. Wait again.
        except WaitTimeout:
            state = self._close(base, f"gave up waiting after {timeout:g} s", turn)
            if meeting.leaving(Cause.DEADLINE, state) is Leave.GO_ON:
                return state  # it opened as this rank gave up: go on with the others
            missing = self._who_is_missing(name, timeout, label, members)
            self._note_gave_up(label, f"waited {timeout:g} s")
            raise WaitTimeout(missing) from None
        except Exception as exc:
            state = self._close(base, f"stopped waiting: {exc}", turn)
            if meeting.notes_gave_up(meeting.leaving(Cause.ERROR, state)):
                self._note_gave_up(label, str(exc))
            raise

    def _close(self, base: str, reason: str, turn: int | None = None) -> Verdict | None:
        """Close an open barrier with a reason (taking its ``turn``, if it meets a step); returns its verdict
        (one that opened, if it opened meanwhile); None if the store is gone."""
        try:
            if turn is not None:
                self.take_turn(turn)
            closed = f"{self.describe(self.rank)} {reason}"
            return verdicts.decode(self.client.compare_set(keys.state(base), "", closed))
        except StoreConnectionError:  # the store itself is gone: nobody to tell
            return None

    def _note_gave_up(self, label: str, why: str) -> None:
        """This rank waits at ``label`` no more: its note must not say it still does."""
        try:
            self.note(f"stopped waiting at {label} ({why})")
        except StoreConnectionError:
            return

    def close_barrier(self, name: str, reason: str) -> Verdict | None:
        """Close barrier ``name`` with this rank's reason, whether or not this rank reached it."""
        return self._close(self.key(name), reason)

    def _missing(self, name: str, members: list[int] | None) -> dict[int, Note | None]:
        """The last recorded activity of each rank that has not arrived at barrier ``name``."""
        ranks = [i for i in (range(self.world_size) if members is None else members) if i != self.rank]
        return {i: last for i, last in self._lasts(ranks).items() if last is None or last.barrier != name}

    def _lasts(self, ranks: list[int]) -> dict[int, Note | None]:
        """The notes of ``ranks`` (None: none yet, or not a note), as they are, in rank order: those of the ranks
        seen to have one in one ``multi_get`` (a note is replaced, never removed), the others one by one until
        they have one."""
        known = [i for i in ranks if i in self._noted]
        texts = self.client.multi_get([self.key(keys.last(i)) for i in known]) if known else []
        found: dict[int, Note | None] = {i: Note.read(t) for i, t in zip(known, texts, strict=True)}
        for i in ranks:
            if i not in found:
                text = self.client.get_if(self.key(keys.last(i)))
                if text is not None:
                    self._noted.add(i)
                found[i] = Note.read(text)
        return {i: found[i] for i in ranks}

    def _missing_work(self, name: str, members: list[int] | None,
                      working: Callable[[int, Note | None], bool]) -> bool:
        """Whether every rank still missing is at work (see :meth:`barrier`); the peer checks vouch for its life."""
        missing = self._missing(name, members)
        return bool(missing) and all(working(i, last) for i, last in missing.items())

    def busy_elsewhere(self, i: int, last: Note | None) -> bool:
        """A ``working`` rule for barriers outside cells: rank ``i`` runs a cell, and waits at no barrier."""
        busy = Busy.read(self.client.get_if(self.key(keys.busy(i))))
        return busy is not None and busy.busy and (last is None or last.barrier is None)

    def _who_is_missing(self, name: str, timeout: float, label: str, members: list[int] | None = None) -> str:
        missing = []
        for i, last in self._lasts(list(range(self.world_size) if members is None else members)).items():
            if last is not None and last.barrier == name:
                continue
            missing.append(f"{self.describe(i)}; {self.doing_as(i, last)}")
        who = "; ".join(missing) or "none (they arrived as this rank gave up)"
        return f"{label}: not every rank arrived within {timeout:g} s. Missing: {who}"

    def doing(self, i: int) -> str:
        """What rank ``i`` does now, in words, for the message of a wait that gives up on it."""
        return self.doing_as(i, self.note_of(i))

    def doing_as(self, i: int, last: Note | None) -> str:
        """:meth:`doing`, from rank ``i``'s note as already read."""
        busy = Busy.read(self.client.get_if(self.key(keys.busy(i))))
        state = ""
        waits = last is not None and last.barrier is not None
        if busy is not None and not busy.busy and not waits:
            state = f"idle since {time.strftime('%H:%M:%S', time.localtime(busy.t))}; "
        elif busy is not None and busy.busy and not waits:
            state = "running a cell; "
        if last is None:
            return f"{state}no activity recorded"
        ago = max(0.0, time.time() - last.t)
        return f"{state}last: {last.what}, {ago:.0f} s ago"

    def leave(self) -> None:
        """Tell the others this rank left (they see it in %dist_status)."""
        self.client.set_json(self.key(keys.left(self.rank)), {"t": time.time()})
        self.client.add(self.key(keys.LEFT_N), 1)
        self.note("left the world")


def step_name(n: int) -> str:
    """The store name of step ``n`` (a cell's keys hang under it): :func:`nbdist.world.keys.step`."""
    return keys.step(n)
