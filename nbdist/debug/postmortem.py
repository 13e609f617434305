"""``%dist_pdb``: post-mortem on any rank, like IPython's ``%debug``, through the store.

Each rank keeps the traceback of its last failed ``%%collective`` body
(:class:`Kept`) until its next ``%%collective`` starts; nothing is kept for a
body that succeeded. In the notebook of that rank, ``%dist_pdb`` runs IPython's
debugger on it in the kernel, as ``%debug`` does. For another rank, the asker
raises the round's request counter and writes a request sealed with the
world's key that names the rank; that rank's heartbeat sees it (one
``add(key, 0)`` per beat, beside ``%dist_where``'s) and starts a short-lived
thread running IPython's debugger on the kept traceback, with its input and
output relayed through the store (:mod:`nbdist.debug.relay`). The thread can
look at the frames because the rank is idle between cells: a peer notebook
waits for its user, a driven rank's main thread waits for the next driven
cell. Nothing listens on a new port.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..errors import StoreConnectionError
from ..world import keys, records, signing
from ..world.liveness import PeerTracker
from ..world.records import Registration
from ..world.store import StoreClient
from ..world.world import World
from . import relay

log = logging.getLogger(__name__)

ASK = "pdb-ask"  # the purpose requests are sealed for
ANSWER_TIMEOUT = 10.0  # seconds the asker waits for the rank's first answer (its heartbeat sees a request in 0.5 s)
QUIT_WAIT = 5.0  # seconds the asker, stopped, waits to see the rank's debugger end


class Kept:
    """This rank's last failed ``%%collective`` body: its exception and traceback, until the next one starts.

    Written by the kernel's main thread (the body), read by the debugger's thread: the state is one tuple,
    replaced whole.
    """

    NONE, STARTED, SUCCEEDED, FAILED = "none", "started", "succeeded", "failed"

    def __init__(self) -> None:
        self._state: tuple[str, BaseException | None, TracebackType | None] = (self.NONE, None, None)
        self.epoch = 0  # raised as a cell starts or the rank leaves: a debugger on the last failure quits

    def begin(self) -> None:
        """A ``%%collective`` starts here: the last one's frames are let go."""
        self.epoch += 1
        self._state = (self.STARTED, None, None)

    def body_ended(self, exc: BaseException | None, tb: TracebackType | None) -> None:
        """The body ended: raising ``exc`` (its user's frames from ``tb``), or not (None)."""
        self._state = (self.SUCCEEDED, None, None) if exc is None else (self.FAILED, exc, tb or exc.__traceback__)

    def clear(self) -> None:
        """This rank left its world."""
        self.epoch += 1
        self._state = (self.NONE, None, None)

    def get(self) -> tuple[BaseException | None, TracebackType | None]:
        _, exc, tb = self._state
        return exc, tb

    def why_none(self, who: str) -> str:
        """Why ``who`` (this rank, described) has nothing to debug; "" if it has."""
        state = self._state[0]
        if state == self.FAILED:
            return ""
        why = {self.NONE: ": no %%collective body failed there since it joined",
               self.STARTED: " since its next cell started",
               self.SUCCEEDED: ": its last cell succeeded"}[state]
        return f"{who} has no failed cell to debug{why}"


# --- this notebook's own rank ----------------------------------------------------------------

def local(kept: Kept, who: str, write: Callable[[str], Any]) -> None:
    """IPython's post-mortem on this rank's kept traceback, in the kernel, as ``%debug`` runs it."""
    exc, tb = kept.get()
    if exc is None or tb is None:
        write(f"nbdist: {kept.why_none(who)}\n")
        return
    from IPython.core.debugger import InterruptiblePdb
    from IPython.core.display_trap import DisplayTrap

    debugger = InterruptiblePdb()
    with DisplayTrap(hook=sys.__displayhook__):  # as %debug: pdb shows values with the system's displayhook
        debugger.reset()
        debugger.interaction(None, tb)


# --- another rank: the request and the debugged rank's side -----------------------------------

@dataclass(frozen=True)
class Request:
    """Debug ``rank``'s kept traceback: the ``n``-th request of world round ``round``, from rank ``asker`` (-1: not
    a rank). Its record (``pdb/ask/<n>``): these fields and ``t``, sealed for :data:`ASK`; validated where read
    (:meth:`read`)."""

    n: int
    round: int
    rank: int
    asker: int = -1
    by: str = ""

    def record(self) -> dict[str, Any]:
        return {"n": self.n, "round": self.round, "rank": self.rank, "asker": self.asker, "by": self.by,
                "t": time.time()}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Request:
        """The request a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = records.Fields(value)
        request = cls(read.count("n"), read.count("round"), read.count("rank"),
                      read.count("asker", least=-1) if "asker" in value else -1, read.text("by", ""))
        read.number("t", 0.0)  # when it was asked: checked, not kept
        return request

    @classmethod
    def read(cls, record: Any, key: bytes, n: int, round_: int) -> Request | None:
        """The request in ``record``, if it is sealed with ``key`` for number ``n`` of round ``round_`` and is one
        (None: not a JSON object, not sealed, or not a request)."""
        return signing.opened(cls.from_dict, record, key, ASK, n, round_)


class Responder:
    """A rank's side: :meth:`tick` runs once per heartbeat in the heartbeat thread; a request for this rank
    starts the debugger in a thread of its own."""

    def __init__(self, round_: int, rank: int, who: str, key: bytes | None, kept: Kept, seen: int = 0,
                 idle: float = relay.IDLE_TIMEOUT, ranks: list[Registration] | None = None) -> None:
        self.round, self.rank, self.who, self._key, self.kept, self.idle = round_, rank, who, key, kept, idle
        self.ranks = ranks or []  # the world's registrations: the debugger quits when the asker's kernel is gone
        self.seen = seen  # requests up to this number were seen, or were made before this rank joined
        self._busy = threading.Lock()
        self.thread: threading.Thread | None = None

    def tick(self, client: StoreClient) -> None:
        """Look for a new request (one store op); open the debugger for one that names this rank."""
        n = client.add(keys.in_round(self.round, keys.PDB_ASKS), 0)
        if n <= self.seen:
            return
        record = records.object_or_none(client.get_if(keys.in_round(self.round, keys.pdb_ask(n))))
        if record is None:
            return  # counted, not yet written: the next beat looks again
        self.seen = n
        if not isinstance(record, dict) or record.get("rank") != self.rank:
            return
        if self._key is None:
            log.warning("nbdist: a %%dist_pdb request (#%d) cannot be checked here (no key): not answered", n)
            return
        request = Request.read(record, self._key, n, self.round)
        if request is None:
            log.warning("nbdist: a %%dist_pdb request (#%d) did not verify: not answered", n)
            return
        if self._busy.locked():  # answered with the heartbeat's own connection: one chunk
            relay.Channel(client, self._key, self.round, n, self.rank).close_with(
                f"{self.who} is already in a %dist_pdb debugger: quit that one first")
            return
        channel = relay.Channel(client.clone(op_timeout=5.0), self._key, self.round, n, self.rank)
        self._busy.acquire()  # before the thread starts: only this thread (the heartbeat's) takes it
        self.thread = threading.Thread(target=self._serve, args=(channel, request), name="nbdist-pdb", daemon=True)
        self.thread.start()

    def _serve(self, channel: relay.Channel, request: Request) -> None:
        try:
            exc, tb = self.kept.get()
            if exc is None or tb is None:
                channel.close_with(self.kept.why_none(self.who))
                return
            log.info("nbdist: %%dist_pdb from %s: the debugger opens on this rank's failed cell", request.by)
            relay.debug(channel, tb, self.idle, self._over(channel.client, request))
        except StoreConnectionError as exc:
            log.info("nbdist: %%dist_pdb ended: %s", exc)
        except Exception:  # never pass silently: the asker sees no answer, this kernel's log says why
            log.exception("nbdist: %%dist_pdb")
        finally:
            channel.client.close()
            self._busy.release()

    def _over(self, client: StoreClient, request: Request) -> Callable[[], str | None]:
        """Why the debugger must quit while it waits for a line (None: it goes on): this rank's next cell
        started or it left its world, or the asking notebook's kernel is gone (by its heartbeat)."""
        epoch = self.kept.epoch
        asker = request.asker if 0 <= request.asker < len(self.ranks) and request.asker != self.rank else None
        tracker = PeerTracker(self.ranks, self.rank)

        def why() -> str | None:
            if self.kept.epoch != epoch:
                return f"{self.who} started its next cell or left its world"
            if asker is None:
                return None
            return next((f"the asking notebook, rank {i}, {why}" for i, why in tracker.dead(client, [asker])),
                        None)

        return why


def responder(world: World, secret: Callable[[], str], kept: Kept) -> Responder:
    """This rank's responder in ``world``: requests made before it joined are not for it."""
    try:
        key: bytes | None = signing.key_from(secret())
    except signing.SigningError:
        key = None  # %dist_where says why, to whoever asks it
    return Responder(world.round, world.rank, label(world, world.rank), key, kept,
                     seen=world.client.add(world.key(keys.PDB_ASKS), 0), ranks=world.ranks)


# --- the asker's side ------------------------------------------------------------------------

def label(world: World, rank: int) -> str:
    """The prompt's label: ``rank 5 (host)``."""
    info = world.ranks[rank] if rank < len(world.ranks) else None
    return f"rank {rank} ({socket.gethostname() if info is None else info.host})"


def debug(world: World, rank: int, kept: Kept, secret: Callable[[], str], timeout: float = ANSWER_TIMEOUT) -> None:
    """``%dist_pdb RANK``: this rank's post-mortem here (:func:`local`), another's relayed (:func:`ask`)."""
    if rank == world.rank:
        local(kept, label(world, rank), sys.stdout.write)
    else:
        ask(world, rank, signing.key_from(secret()), write=sys.stdout.write, read_line=input, timeout=timeout)


def ask(world: World, rank: int, key: bytes, *, write: Callable[[str], Any], read_line: Callable[[str], str],
        timeout: float = ANSWER_TIMEOUT, idle: float = relay.IDLE_TIMEOUT) -> None:
    """Open the debugger on ``rank`` and relay it here until it ends: its output written with ``write``, each
    line read with ``read_line(prompt)`` (``input``); the stop button or EOF quits it."""
    client = world.client
    n = client.add(world.key(keys.PDB_ASKS), 1)
    request = Request(n, world.round, rank, world.rank, world.describe(world.rank))
    client.set_json(world.key(keys.pdb_ask(n)), signing.seal(key, ASK, request.record()))
    channel = relay.Channel(client, key, world.round, n, rank)
    tracker = PeerTracker(world.ranks, world.rank)
    prompt_label = label(world, rank)

    def gone() -> str | None:
        if rank == world.rank:
            return None
        return next((f"{world.describe(i)} {why}" for i, why in tracker.dead(client, [rank])), None)

    first = True
    try:
        while True:
            chunk = channel.receive(timeout if first else idle, gone)
            if chunk.text:
                write(chunk.text if chunk.text.endswith("\n") else chunk.text + "\n")
            if chunk.end is not None:
                if chunk.end:
                    write(f"nbdist: {chunk.end}\n")
                return
            first = False
            try:
                line: str | None = read_line(f"{prompt_label} {chunk.prompt.strip()} ")
            except EOFError:
                line = None
            channel.send(line)
    except KeyboardInterrupt:  # the stop button: quit the debugger there too, and see it end (a moment)
        channel.send(None)
        try:
            channel.receive(QUIT_WAIT, gone)
        except KeyboardInterrupt:  # pressed again: leave at once
            pass
        write(f"nbdist: left the debugger of {prompt_label} (the stop button)\n")
