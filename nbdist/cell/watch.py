"""A watcher beside a running body: it stops the cell for a reason, and cuts only when it must.

While a %%collective body (or a plain cell, in a formed world) runs on the
kernel's main thread, this thread watches, every 0.1 s, for: another
rank's failure in this cell (its ``failed`` key; not for plain cells), a rank
that is gone (see :class:`~nbdist.world.liveness.PeerTracker`), the rendezvous server
going away, the stop button (SIGINT, seen through ``signal.set_wakeup_fd``,
since it is not delivered while C++ blocks), ``--max-time`` running out, and a
stop of every rank handed over by the guard (:mod:`nbdist.cell.guard`). The last two
end even a computing body, through :mod:`nbdist.cell.stopper`. It also gives the
live table (:mod:`nbdist.cell.live`) its turn. A plain cell's watch does
nothing but wait for the stop button until the cell starts a collective, by
torch's own count (:mod:`nbdist.cell.inflight`): DDP's backward is one too.

Stopping the cell means: no collective may start any more (the cell's
:class:`~nbdist.cell.fingerprint.Checker` refuses it). The process group is *cut*
(see :mod:`nbdist.backend.procgroup`) only when a collective may be waiting: the body
is inside one, or inside torch code that runs them (DDP's backward, a name
imported before nbdist wrapped it), or a rank is gone, or the stop button was
pressed and the body has not ended a second later. A body that is computing
is left alone, so a failure elsewhere does not break groups and DDP models
that nothing was waiting on.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

from ..config import POLL_INTERVAL
from ..errors import (
    CollectiveMismatchError,
    MaxTimeError,
    NbdistError,
    PeerLostError,
    StoppedError,
    StoreConnectionError,
)
from ..world import keys, records
from ..world.store import StoreClient
from ..world.world import World
from . import watchthread
from .fingerprint import Checker, ended
from .inflight import Since, pending
from .stopper import Stopper

log = logging.getLogger(__name__)

# A stop button the body has not answered this long is taken to be stuck in C code: cut.
INTERRUPT_GRACE = 1.0
# A collective that lasts this long is noted in the store, for the others' messages and %dist_status.
LONG_COLLECTIVE = 0.5
# Another rank's --max-time (every rank's, as its body, started together) ran out this close to this rank's own:
# this rank's ran out too, and it says so itself (one error for all, not a cut that reads differently).
MAX_TIME_TOGETHER = 1.0
SERVER = "server"  # the kind of a cell's reason when the rendezvous server went away: kept here, nobody can be told
# Where torch runs collectives that nbdist's wrappers do not see.
_COLLECTIVE_CODE = tuple(os.path.join("torch", part, "") for part in ("distributed", os.path.join("nn", "parallel"),
                                                                         "autograd"))


def publish(client: StoreClient, world: World, cell: str, failure: records.Failure) -> records.Failure:
    """Record the first failure of a cell (the first one wins); returns the one that won.

    Text there that is not a failure (anyone can write into the store) is no failure: this one replaces it.
    """
    key, mine = world.key(keys.failed(cell)), failure.to_json()
    current = client.compare_set(key, "", mine)
    for _ in range(3):
        if current == mine:
            return failure
        try:
            return records.Failure.from_json(current)
        except records.MalformedRecord as exc:
            log.warning("%s held no failure (%s): this rank's replaces it", key, exc)
            current = client.compare_set(key, current, mine)
    return failure




def plain_failures(client: StoreClient, world: World) -> int:
    """How many plain cells of this world's ranks ended early during their collectives so far."""
    return client.add(world.key(keys.PLAIN_FAILED_N), 0)


def publish_plain_failure(client: StoreClient, world: World, message: str) -> None:
    """This rank's plain cell ended early during its collectives: the others' plain cells must not wait for it."""
    n = client.add(world.key(keys.PLAIN_FAILED_N), 1)
    client.set(world.key(keys.plain_failed(n)), records.Failure(world.rank, "error", message).to_json())


def plain_failure(client: StoreClient, world: World, since: int) -> records.Failure | None:
    """Another rank's plain-cell failure published after the first ``since``, if any (a cell's reason for stopping).

    Text there that is not a failure (anyone can write into the store) is none.
    """
    n = plain_failures(client, world)
    for i in range(n, since, -1):
        failure = records.Failure.read(client.get_if(world.key(keys.plain_failed(i))))
        if failure is not None and failure.rank != world.rank:
            return failure
    return None


def _read(fd: int) -> bytes:
    """What waits on the watching thread's pipe (nothing, where a cell that ended drained it first)."""
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def in_collective_code(thread_id: int) -> bool:
    """Whether a thread's innermost Python frame is in torch code that runs collectives."""
    frame = sys._current_frames().get(thread_id)
    return frame is not None and any(part in frame.f_code.co_filename for part in _COLLECTIVE_CODE)


class CellWatch:
    """Watches one cell of one rank. :attr:`reason` says why it stopped the cell, :attr:`cut` whether it cut."""

    def __init__(self, world: World, client: StoreClient, cell: str, checker: Checker, label: str = "",
                 on_tick: Callable[[], None] | None = None, max_time: float | None = None,
                 stopper: Stopper | None = None, plain: bool = False, driver: int | None = None,
                 plain_since: int | None = 0, since: Since | None = None,
                 refuse: Callable[[], BaseException | None] | None = None) -> None:
        self.world, self.client, self.cell, self.checker = world, client, cell, checker
        self.driver = driver  # a follower's: the stop button of the notebook that drives it stops its body too
        self._on_tick = on_tick  # the live table's turn, every slice (it keeps its own pace)
        self.max_time, self.stopper = max_time, stopper
        self.plain = plain  # a plain cell's: no other rank is in it, so only peers, the stop button, stops
        self.plain_since = plain_since  # a plain cell's: the plain failures published before it began (None: read)
        # A plain cell watched from its start: the groups' counts then (nothing to watch until one moves), and
        # what refuses a collective that torch's own code started (a driving notebook's followers never join it).
        self.since, self.refuse = since, refuse
        self._used = since is None or not plain
        self._own_checked = 0.0  # when a %%collective's watch last compared torch's count with finished ranks'
        self._own_since: float | None = None  # since when the body has been in torch's collective code
        self._ended = ended(world, cell)  # the ranks that finished the body, for that comparison (this thread's)
        self._refused = False
        self._started = time.monotonic()
        self._timed_out = False
        self.cell_label = label or cell
        self._noted: tuple[str, float] | None = None
        self.reason: records.Failure | None = None  # why the cell stops: the first failure this watch saw
        self.interrupted = False
        self.forced = False  # nbdist itself ended the body (--max-time, a stop of every rank)
        self._forced_at = 0.0
        self.cut = False
        self._interrupted_at = 0.0
        self._body = threading.get_ident()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # held by the watching thread while it acts for this cell (see __exit__)
        self._runner: watchthread.Runner | None = None  # the thread that runs this watch, and its pipe
        self._old_wakeup: int | None = None

    def __enter__(self) -> CellWatch:
        if self.stopper is not None:
            self.stopper.watch = self
        # Not waited for: the kernel's watching thread takes it, at once where it reads the plain failures first
        self._runner = watchthread.run(self, prompt=self.plain_since is None)
        if threading.current_thread() is threading.main_thread():
            self._old_wakeup = signal.set_wakeup_fd(self._runner.write_fd, warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stopper is not None and self.stopper.watch is self:
            self.stopper.watch = None
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
        # The watching thread looks at _stop before each slice, and holds the lock through it: once this cell has
        # the lock, the thread acts for it no more. A thread that waits in its select holds nothing, so a cell's end
        # waits only for a slice the thread is inside.
        self._stop.set()
        if self._lock.acquire(timeout=5):
            try:
                if self._runner is not None:
                    self._runner.drain()  # signal bytes sent during this cell are not the next cell's
            finally:
                self._lock.release()
        # Not woken now, while the cell ends: the thread lets this watch go at its next slice, or at the next take.

    def ended(self) -> bool:
        """Whether the cell ended (its watching thread then lets it go)."""
        return self._stop.is_set()

    def watch(self, read_fd: int) -> None:
        """The watching thread's: every slice (:data:`POLL_INTERVAL`, or a signal or wake-up on ``read_fd``), look
        for a reason to stop the cell, until it ends; each slice holds :attr:`_lock` and begins by checking that."""
        failed_key = self.world.key(keys.failed(self.cell))
        with self._lock:
            if self._stop.is_set():
                return
            if self.plain_since is None:  # read here, beside the body, so a cell that starts no collective never waits
                try:
                    self.plain_since = plain_failures(self.client, self.world)
                except StoreConnectionError as exc:
                    log.info("could not read the plain failures: %s", exc)
                    self.plain_since = 0
        while True:
            ready, _, _ = select.select([read_fd], [], [], POLL_INTERVAL)
            if self._stop.is_set():
                return
            with self._lock:
                if self._stop.is_set():
                    return
                self._slice(_read(read_fd) if ready else b"", failed_key)

    def _slice(self, data: bytes, failed_key: str) -> None:
        if data:
            self._forward(data)
            if signal.SIGINT in data and not self.interrupted:
                self.interrupted, self._interrupted_at = True, time.monotonic()
                self._stop_cell(records.Failure(self.world.rank, "interrupted",
                                                f"{self.world.describe(self.world.rank)} interrupted its cell"),
                                tell=True)
        if self.refuse is not None and not self._refused and self.in_use():
            self._refuse_own()
        if self.reason is None and self.in_use():
            self._look_around(failed_key)
        if self.reason is None and not self.plain and self.since is not None:
            self._check_own_mismatch()
        self._check_max_time()  # a failure elsewhere leaves a computing body alone; --max-time does not
        self._cut_if_needed()
        self._note_long_collective()
        if self._on_tick is not None:
            try:
                self._on_tick()
            except Exception:  # a display problem must never stop the watcher
                log.exception("nbdist: the live table failed")

    def stuck_since(self) -> float | None:
        """Since when the body has waited in one collective (nbdist's, torch's own, or its comparison); None:
        it does not wait in one now."""
        times = [t for t in (self.checker.inside, self.checker.reaching) if t is not None]
        since = [t[1] for t in times] + ([self._own_since] if self._own_since is not None else [])
        return min(since) if since else None

    def in_use(self) -> bool:
        """Whether the cell started a collective (always, for a watch that began at its first one)."""
        if not self._used:
            self._used = self.checker.inside is not None or (self.since is not None and self.since.moved())
        return self._used

    def _refuse_own(self) -> None:
        """A collective that torch's own code started where it must not (a driving notebook): cut it, raise why."""
        self._refused = True
        exc = self.refuse() if self.refuse is not None else None
        if exc is None:
            return
        self._stop_cell(records.Failure(self.world.rank, "error", str(exc)), tell=False)
        self._raise_in_body(exc)  # first: pending as the cut collective returns to Python, it is what the cell raises
        if self.world.pg is not None and not self.cut:
            self.cut = True
            self.world.pg.cut(str(exc))

    def _check_own_mismatch(self) -> None:
        """A %%collective body waiting in a collective that torch's own code started (nothing wraps it), which a
        rank that finished its body never started: name the mismatch, and end it on this rank (cut)."""
        now = time.monotonic()
        if self.checker.inside is not None or not in_collective_code(self._body):
            self._own_since = None
            return
        if self._own_since is None:
            self._own_since = now
        # Only a wait that lasts (every rank may be in DDP's backward a moment), and not every tick: store reads.
        if now - self._own_since < LONG_COLLECTIVE or now - self._own_checked < LONG_COLLECTIVE:
            return
        self._own_checked = now
        pg = self.world.pg
        if pg is None or not self.since.moved():  # type: ignore[union-attr]
            return
        mine = pg.state().get("seq", {})
        finished = self._ended.look(self.client, [i for i in range(self.world.world_size) if i != self.world.rank])
        for i in sorted(finished):
            theirs = (finished[i].pg or {}).get("seq", {})
            ahead = [(group, n, theirs[group]) for group, n in mine.items() if group in theirs and n > theirs[group]]
            if not ahead:
                continue
            group, n, issued = ahead[0]
            label = "the default group" if group == "0" else f"group {group}"
            what = ", ".join(pending()) or "a collective"
            me = self.world.describe(self.world.rank)
            message = (f"{self.world.describe(i)} finished this cell after {issued} collective(s) on {label}, but "
                       f"{me} waits in #{n} ({what}), which torch's own code started (DDP's backward, FSDP, a "
                       "functional collective): the ranks run different collectives")
            self._stop_cell(records.Failure(self.world.rank, "mismatch", message), tell=True)
            self._raise_in_body(CollectiveMismatchError(message))  # first: it is what the body raises after the cut
            if not self.cut:
                self.cut = True
                pg.cut(message)
            return

    def _check_max_time(self) -> None:
        if self.max_time is None or self._timed_out:
            return
        theirs = self.reason is not None and self.reason.kind == "max-time" and self.reason.rank != self.world.rank
        if time.monotonic() - self._started < self.max_time - (MAX_TIME_TOGETHER if theirs else 0.0):
            return
        self._timed_out = True
        me = self.world.describe(self.world.rank)
        message = f"{me} was still running its body after --max-time {self.max_time:g} s"
        self._stop_cell(records.Failure(self.world.rank, "max-time", message), tell=True)
        self._raise_in_body(MaxTimeError(message))

    def stop_all(self, stop: records.Failure) -> None:
        """Someone stopped every rank (%dist_stop, nbdist stop): end this body now, cutting if it must."""
        self._stop_cell(stop, tell=True)
        self._raise_in_body(StoppedError(stop.message))

    def _raise_in_body(self, exc: BaseException) -> None:
        """A body that is computing ends at once; one inside a collective ends when the cut fails it."""
        if not self.forced:
            self.forced, self._forced_at = True, time.monotonic()
        if self.stopper is not None:
            self.stopper.stop(exc)

    def _look_around(self, failed_key: str) -> None:
        try:
            if self.plain:
                info = plain_failure(self.client, self.world, self.plain_since or 0)
                if info is not None:
                    self._stop_cell(info, tell=False)  # a rank that waits in a collective for it cuts
                    return
            failure = None if self.plain else records.Failure.read(self.client.get_if(failed_key))
            if failure is not None:
                if failure.rank != self.world.rank:
                    self._stop_cell(failure, tell=False)
                    if failure.rank == self.driver and failure.kind == "interrupted":
                        self._raise_in_body(StoppedError(failure.message))
                    return
            self.world.checks.peers(self.client)
        except PeerLostError as exc:
            self._stop_cell(records.Failure(records.WORLD, "lost", str(exc)), tell=True)
        except StoreConnectionError as exc:
            self._stop_cell(records.Failure(records.WORLD, SERVER, str(exc)), tell=False)
        except NbdistError as exc:
            log.warning("nbdist watcher: %s", exc)

    def _stop_cell(self, failure: records.Failure, tell: bool) -> None:
        log.debug("%s: stopping (%s); inside %s", self.cell, failure.message, self.checker.inside)
        if self.reason is None:
            self.reason = failure
        if tell:
            try:
                publish(self.client, self.world, self.cell, failure)
            except StoreConnectionError as exc:
                log.info("could not tell the others: %s", exc)
        self.checker.stop(failure)

    def _cut_if_needed(self) -> None:
        if self.cut or self.reason is None or self.world.pg is None or not self.in_use():
            return  # a plain cell that started no collective has none to cut
        must = (
            self.reason.kind == "lost"  # the group has a dead member: nothing on it can complete
            or self.checker.inside is not None
            or in_collective_code(self._body)
            or (self.interrupted and time.monotonic() - self._interrupted_at > INTERRUPT_GRACE)
            or (self.forced and time.monotonic() - self._forced_at > INTERRUPT_GRACE)
        )
        if must:
            self.cut = True
            log.debug("%s: cutting; inside %s", self.cell, self.checker.inside)
            self.world.pg.cut(self.reason.message)

    def _note_long_collective(self) -> None:
        """Tell the others (and %dist_status) which collective this rank has been inside for a while.

        The note keeps saying that the rank runs this cell's body (the others' end barrier waits for a
        rank at work in it), and is taken back when the collective ends.
        """
        inside = self.checker.inside
        if inside is None and self._noted is not None:
            self._noted = None
            self._note(f"running {self.cell_label}")
            return
        if inside is None or inside == self._noted or time.monotonic() - inside[1] < LONG_COLLECTIVE:
            return
        self._noted = inside
        self._note(f"inside {inside[0]} of {self.cell_label}", inside[0])

    def _note(self, what: str, collective: str | None = None) -> None:
        note = records.Note(what, time.time(), body=None if self.plain else self.cell, collective=collective)
        try:
            self.client.set(self.world.key(keys.last(self.world.rank)), note.to_json())
        except StoreConnectionError as exc:
            log.info("could not note the collective: %s", exc)

    def _forward(self, data: bytes) -> None:
        """Hand signal bytes on to the previous wakeup fd (the event loop's), minus our own wake-up."""
        data = data.replace(b"\0", b"")
        if data and self._old_wakeup not in (None, -1):
            try:
                os.write(self._old_wakeup, data)
            except OSError as exc:
                log.debug("could not forward signal bytes: %s", exc)
