"""One notebook drives the world: followers take their cells from the store.

A follower is a rank like any other; only where its cells come from differs.
The driving notebook runs ``%%collective`` (or ``%dist_barrier``) as in
lockstep, and first publishes the cell, signed (:mod:`nbdist.world.signing`), under
``drive/<seq>`` of the world round. Each follower waits there, checks the
signature, the round, the sequence number and the driver, and then runs the
very same protocol (:mod:`nbdist.cell.cells`) with that source and those flags.

Keys, under ``r/<round>/``: ``drive/claim`` (the driving rank and session,
empty when released), ``drive/seq`` (the last published number),
``drive/followers`` (how many ranks follow), ``follow/<rank>`` (this rank's
session while it follows), ``drive/refused`` (a follower's refusal, for the
driver to report).

The first notebook to run a cell while some rank follows holds the drive
until ``%dist_release`` or until it leaves; while it does, another notebook
that runs its own ``%%collective`` is told who drives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from ..cell import cellerror, cells, turn
from ..errors import DriveError, JoinError, NbdistError, StoreConnectionError, WorldChangedError
from ..ranksets import fold
from ..world import keys, records, signing
from ..world.gather import UNBOUNDED
from ..world.pulse import beat_from
from ..world.world import World

CLAIM, SEQ, FOLLOWERS, REFUSED = keys.DRIVE_CLAIM, keys.DRIVE_SEQ, keys.DRIVE_FOLLOWERS, keys.DRIVE_REFUSED
PUBLISH_GRACE = 2.0  # seconds a numbered message may take to be written (it takes milliseconds)
DRIVER_CHECK = 1.0  # seconds between a follower's looks at whether its driver lives


class FollowEnded(Exception):
    """Following ended for a reason that is not an error of this rank: the driver released, left, or is gone."""

    def __init__(self, why: str, released: bool = True) -> None:
        super().__init__(why)
        self.released = released


@dataclass
class Ended:
    """Why following ended; ``released``: the driver released the world or left it (not a failure)."""

    why: str
    released: bool

    def __str__(self) -> str:
        return self.why


def followers(world: World) -> int:
    return world.client.add(world.key(FOLLOWERS), 0)


def holder(world: World) -> records.DriveClaim | None:
    """Who holds the drive, or None (:meth:`.records.DriveClaim.read`: a claim that is not one is no one's)."""
    return records.DriveClaim.read(world.client.get_if(world.key(CLAIM)))


def _alive(world: World, who: records.DriveClaim | None) -> bool:
    """Whether the notebook that holds the drive is still that rank, and its kernel lives."""
    if who is None or not 0 <= who.rank < len(world.ranks) or world.ranks[who.rank].session != who.session:
        return False
    beat = beat_from(world.client.get_if(keys.heartbeat(who.session)))
    return beat is None or not beat.gone


@dataclass
class Drive:
    """This kernel's side of driving: the claim, the key, and publishing."""

    session: str
    holding: bool = False
    _key: bytes | None = None
    _seq: int = 0  # the last sequence number this notebook published (or saw, when it took the drive)

    def key(self, secret: Callable[[], str]) -> bytes:
        if self._key is None:
            self._key = signing.key_from(secret())
        return self._key

    def before(self, world: World, secret: Callable[[], str], kind: str, source: str = "",
               flags: dict[str, Any] | None = None, step: int = 0) -> None:
        """Before this notebook runs a cell or barrier of its own, as the world's ``step``: publish it to the
        followers, if any.

        Raises :class:`DriveError` if another notebook drives, or a follower refused an earlier cell.
        """
        if not self.holding:
            if followers(world) == 0 and not follow_processes(world):
                return  # lockstep: every notebook runs its own cells
            self.take(world)
        # Published even while no rank follows yet: a follower that starts before the cell does takes it.
        self.publish(world, secret, kind, source, flags or {}, step)

    def has_followers(self, world: World) -> bool:
        """Whether some other rank of ``world`` runs only a driver's cells now: one that follows this notebook, or
        an ``nbdist follow`` process (it follows from the moment it joined, before any cell was driven)."""
        return (self.holding and followers(world) > 0) or bool(follow_processes(world))

    def take(self, world: World) -> None:
        """Hold the drive of ``world`` (raise :class:`DriveError` if a live notebook holds it)."""
        me = records.DriveClaim(world.rank, self.session).to_json()
        current = world.client.compare_set(world.key(CLAIM), "", me)
        if current != me:
            other = records.DriveClaim.read(current)
            if other is not None and _alive(world, other):
                who = fold(following(world)) or "none now"
                raise DriveError(
                    f"{world.describe(other.rank)} drives this world (ranks following it: {who}): its cells run "
                    "there and on its followers. Run %dist_follow here to follow it too, or %dist_release there "
                    "first; nothing ran")
            current = world.client.compare_set(world.key(CLAIM), current, me)  # its notebook is gone: take over
            if current != me:
                raise DriveError("another notebook took the drive of this world at the same moment; nothing ran")
        self.holding = True
        self._seq = world.client.add(world.key(SEQ), 0)

    def publish(self, world: World, secret: Callable[[], str], kind: str, source: str = "",
                flags: dict[str, Any] | None = None, step: int = 0) -> int:
        """Sign and publish one message for the followers (for a cell or barrier: the world's ``step`` it is, which
        the followers meet at); returns its sequence number."""
        key = self.key(secret)
        seq = world.client.add(world.key(SEQ), 1)
        skipped, self._seq = seq != self._seq + 1, seq
        if skipped:  # a follower refused a message and burned its slot (see Follower._refuse)
            self._refused(world)
        message = records.Message(round=world.round, seq=seq, driver=world.rank, session=self.session, kind=kind,
                                  source=source, flags=flags or {}, gen=world.gen, number=step, t=time.time())
        message = message.signed(signing.sign(key, message.as_dict())["sig"])
        world.client.set(world.key(keys.drive(seq)), message.to_json())
        return seq

    def _refused(self, world: World) -> None:
        text = world.client.get_if(world.key(REFUSED))
        if text is None:
            return
        world.client.delete(world.key(REFUSED))
        try:
            refusal = records.Refusal.from_json(text)
        except records.MalformedRecord as exc:
            raise DriveError(f"a follower refused a message sent as from this notebook and stopped following, but its "
                             f"refusal is not one nbdist writes ({exc}); nothing ran. Someone who can reach the "
                             "rendezvous port may have written into the store") from None
        raise DriveError(f"{world.describe(refusal.rank)} refused message #{refusal.seq} sent as from this "
                         f"notebook ({refusal.reason}) and stopped following; nothing ran. Someone who can "
                         "reach the rendezvous port may have written into the store")

    def release(self, world: World, secret: Callable[[], str], why: str = "") -> bool:
        """Give up the drive; the followers stop following (told ``why``). True if this notebook held it."""
        if not self.holding:
            return False
        self.holding = False
        me = records.DriveClaim(world.rank, self.session).to_json()
        if world.client.compare_set(world.key(CLAIM), me, "") != "":
            return False  # taken over meanwhile (this notebook was thought gone)
        if followers(world):
            self.publish(world, secret, "release", why)
        return True


def follow_processes(world: World) -> list[int]:
    """The other ranks that are ``nbdist follow`` processes: they run no cell of their own, only a driver's.

    Such a rank follows from the moment it joined, even before it counts itself among the followers (a
    moment later): the first cell of a notebook must be published for it, not run in lockstep without it.
    """
    return [i for i, info in enumerate(world.ranks) if i != world.rank and info.process == "nbdist follow"]


def following(world: World) -> list[int]:
    """The ranks that follow now (from their ``follow/<rank>`` keys)."""
    return [i for i in range(world.world_size) if world.client.get_if(world.key(keys.follow(i)))]


Followed = records.Message  # one verified message from the driver


class Follower:
    """This rank's side of following: wait for each signed message and hand it over, verified."""

    def __init__(self, world: World, session: str, secret: str) -> None:
        self.world, self.session = world, session
        self._key = signing.key_from(secret)
        self._next_driver_check = 0.0
        self._claim: records.DriveClaim | None = None  # who held the drive when last read
        self.seq = self._first_seq()

    def __enter__(self) -> Follower:
        world = self.world
        world.client.set(world.key(keys.follow(world.rank)), self.session)
        world.client.add(world.key(FOLLOWERS), 1)
        return self

    def __exit__(self, *_: Any) -> None:
        world = self.world
        try:
            world.client.add(world.key(FOLLOWERS), -1)
            world.client.set(world.key(keys.follow(world.rank)), "")
        except NbdistError:  # the server is gone: nobody to tell
            return

    def _first_seq(self) -> int:
        """The next message due: the last published one, if its cell has not started yet (the driver waits)."""
        world = self.world
        last = world.client.add(world.key(SEQ), 0)
        if last == 0:
            return 1
        text = self._published(last)
        if text is None:
            return last + 1  # numbered, never written: the driver's publish failed (it was told of a refusal)
        try:
            cell = records.Message.from_json(text)
        except records.MalformedRecord:
            return last + 1  # not a message: the driver's next one goes after it
        rank = cell.driver
        driver = {"rank": rank, "session": world.ranks[rank].session} if rank < world.world_size else {}
        if cell.kind in ("collective", "barrier") and not signing.verify(
                self._key, cell.as_dict(), round_=world.round, seq=last, driver=driver):
            # check, not get_if: a compare-and-set on the missing key would wake the driver's wait on it.
            started = world.client.check([world.key(keys.state(keys.arrival(cell.number)))])
            if not started and time.time() - cell.t < 600:
                return last
        return last + 1

    def _published(self, seq: int) -> str | None:
        """Message ``seq``, given a moment to appear: the driver numbers it (add), then signs and writes it."""
        key = self.world.key(keys.drive(seq))
        deadline = time.monotonic() + PUBLISH_GRACE
        # check, not get_if: a compare-and-set on the missing key would wake the waits on it.
        while not self.world.client.check([key]):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return self.world.client.get_if(key)

    def next(self) -> Followed:
        """Wait for the next message (the stop button ends the wait); raise :class:`FollowEnded` or refuse."""
        world = self.world
        key = world.key(keys.drive(self.seq))
        text = None
        while text is None:  # None: woken by another client's read of the missing key (as a barrier is)
            world.client.wait([key], UNBOUNDED, on_tick=self._tick)
            text = world.client.get_if(key)
        try:
            cell = records.Message.from_json(text)
        except records.MalformedRecord as exc:
            claims = exc.value or {}  # what a message that is not one claims: refused all the same
            self._refuse(claims.get("driver"), claims.get("number"), f"it is not a message nbdist sends ({exc})")
        claim = self._claim
        if claim is None or (claim.rank, claim.session) != (cell.driver, cell.session):
            claim = self._claim = holder(world)  # read again only when another notebook seems to send
        rank = cell.driver if claim is None else claim.rank
        driver = world.ranks[rank] if 0 <= rank < len(world.ranks) else None
        why = signing.verify(self._key, cell.as_dict(), round_=world.round, seq=self.seq,
                             driver={"rank": rank, "session": None if driver is None else driver.session})
        if why is not None:
            self._refuse(cell.driver, cell.number, why)
        self.seq += 1
        if cell.kind == "release":
            why = cell.source or "released the world (%dist_release): this notebook runs its own cells again"
            raise FollowEnded(f"{world.describe(cell.driver)} {why}")
        return cell

    def _tick(self) -> None:
        self.world.checks.world()
        now = time.monotonic()
        if now < self._next_driver_check:
            return
        self._next_driver_check = now + DRIVER_CHECK
        claim = holder(self.world)
        if claim is not None and not _alive(self.world, claim):
            raise FollowEnded(f"the driving notebook, {self.world.describe(claim.rank)}, is gone", released=False)

    def _refuse(self, claimed: object, number: object, why: str) -> NoReturn:
        """Tell the driver, end the cell it may be waiting in, and raise here: nothing of the cell runs.

        ``claimed``, ``number``: the driver and the step the message claims (anyone's word: it did not verify).
        """
        world = self.world
        world.client.set(world.key(REFUSED), records.Refusal(world.rank, self.seq, why).to_json())
        # Burn the slot: the driver's next message goes after it (and the driver hears of this there).
        world.client.compare_set(world.key(SEQ), str(self.seq - 1), str(self.seq))
        turn.refuse_sent(world, number, f"refused the cell: {why}")
        raise signing.SigningError(
            f"nbdist refused message #{self.seq} (sent as from rank {claimed}): {why}. Nothing of it ran; this "
            "notebook stopped following and stays in the world")


# Errors after which this world cannot go on as it was: the follower stops following.
_ENDS = (StoreConnectionError, WorldChangedError, JoinError)


@dataclass
class Shows:
    """How a following notebook shows what it runs (the magics' displays)."""

    source: Callable[[Followed], None] | None  # None: not shown
    outcome: Callable[[Any], None]
    error: Callable[[BaseException], None]
    barrier: Callable[[float], None]
    started: Callable[[], None] = lambda: None
    tables: bool = True  # whether ``outcome`` draws the cell's table: if not, the outcome holds only what errors need


class FollowHost(Protocol):
    """What following calls for each of the driver's messages: the kernel's session, in these parts."""

    def barrier(self, timeout: float, step: int | None = None) -> float: ...

    def collective(self, source: str, flags: cells.Flags, align: tuple[int, int] | None = None,
                   driver: int | None = None, shows_table: bool = True) -> cells.Outcome: ...


def run(session: FollowHost, follower: Follower, show: Shows) -> Ended:
    """Run every message of the driver until following ends; returns why it ended.

    Each cell's own error is shown and following goes on, as the driver goes on;
    the stop button here (a plain KeyboardInterrupt) ends following and is raised.
    """
    with follower:
        show.started()
        while True:
            try:
                msg = follower.next()
            except FollowEnded as exc:
                return Ended(str(exc), exc.released)
            except _ENDS as exc:
                return Ended(f"following ended: {exc}", False)
            try:
                if msg.kind == "barrier":
                    show.barrier(session.barrier(float(msg.flags.get("timeout", 300.0)), step=msg.number))
                    continue
                shown = None
                if show.source is not None:
                    shown = threading.Thread(target=show.source, args=(msg,), daemon=True)
                    shown.start()  # while this rank meets the others: the driver waits for it
                outcome = session.collective(msg.source, cells.Flags.received(msg.flags), align=(msg.gen, msg.number),
                                             driver=msg.driver, shows_table=show.tables)
            except KeyboardInterrupt as exc:
                if type(exc) is KeyboardInterrupt:
                    _show_partial(show, exc)
                    raise
                _show_partial(show, exc)
                show.error(exc)
                continue
            except NbdistError as exc:
                _show_partial(show, exc)
                show.error(exc)
                if isinstance(exc, _ENDS):
                    return Ended(f"following ended: {exc}", False)
                continue
            if shown is not None:
                shown.join()
            show.outcome(outcome)
            error = cellerror.error_for(follower.world, outcome)  # the session's world, which it follows
            if type(error) is KeyboardInterrupt:
                raise error
            if error is not None:
                show.error(error)


def _show_partial(show: Shows, exc: BaseException) -> None:
    """A cell cut short may still have every rank's table so far: show it."""
    partial = cells.partial_of(exc)
    if partial is not None:
        show.outcome(partial)
