"""The watch over a spawned world's followers: one whose process died is recorded and, as :mod:`.restarts` decides,
started again in its slot; the ranks that lose it are told how it ended (``exited/<i>``).

One watch for every kind of follower. Local worker kernels (:mod:`.workers`) and the tasks of a Slurm job
(:mod:`.slurm`) each say how to look at one of their slots, how to clean up after its process and how to start it
again; deciding, counting, telling the other ranks, and ordering a restart against shutdown are done here, once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from ..errors import StoreConnectionError
from ..world import keys
from ..world.exited_record import Exited
from ..world.store import StoreClient
from . import restarts
from .restarts import Exit

LOOK_INTERVAL = 0.5  # seconds between the supervisor's looks at the followers

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """One follower's place in the world (its rank), across the processes that held it."""

    rank: int
    joined: bool = False  # its current process joined the world
    failed: str | None = None  # why its current process failed to join, once known
    restarts: list[float] = field(default_factory=list)  # when (monotonic) it was started again
    exits: list[Exit] = field(default_factory=list)  # how each of its processes that died ended
    down: str | None = None  # why it was left down after it died, once it was

    def note(self, text: str) -> None:
        """Keep a line of nbdist's own among the slot's last lines (%dist_workers)."""


@dataclass(frozen=True)
class Ending:
    """How a slot's process ended, as its kind of follower sees it."""

    pid: int | None
    how: str  # :func:`.restarts.describe`, or the launcher's words
    rss_kb: int | None  # the memory it held at the last look, where known
    lines: tuple[str, ...]  # its last lines, for %dist_workers
    told: list[str]  # the last few lines its process wrote, for the other ranks


S = TypeVar("S", bound=Slot)


class Supervisor(Generic[S]):
    """Watch the slots every LOOK_INTERVAL s on a thread of its own, from :meth:`_watch` until :meth:`_unwatch`."""

    after_down = restarts.AFTER_DOWN  # what to do about a rank left down

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        # One lock orders a restart against shutdown: once shutdown holds it, nothing starts.
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._report: tuple[StoreClient, Callable[[str], str]] | None = None  # where deaths are told (report_to)

    # --- what each kind of follower says ---------------------------------------------------------------------
    def slots(self) -> list[S]:
        raise NotImplementedError

    def _watched(self, s: S) -> bool:
        """Whether ``s`` is watched now (:func:`nbdist.drive.restarts.watched`): its process joined, or was started
        again, and every slot once the world formed (:meth:`report_to`); the spawn's own wait watches a first join."""
        return restarts.watched(s.joined, bool(s.restarts), self._report is not None)

    def _round(self) -> None:
        """Before each look at every slot (e.g. read what the launcher said since)."""

    def _check(self, s: S) -> Ending | None:
        """How ``s``'s process ended, or None while it runs."""
        raise NotImplementedError

    def _cannot_restart(self, s: S) -> str | None:
        """Why ``s`` cannot be started again whatever the policy says (in words that finish "left down: ..."), or
        None."""
        return None

    def _clean(self, s: S) -> None:
        """Stop what is left of ``s``'s process."""
        raise NotImplementedError

    def _start(self, s: S) -> None:
        """Start ``s``'s process (again), with its rank, flags and environment; raise if it cannot."""
        raise NotImplementedError

    def _reset(self, s: S) -> None:
        """Forget what ``s``'s last process was, before it is started again."""
        s.joined, s.failed = False, None

    # --- the watch -------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        with self._lock:
            if not self._closing.is_set():
                self._supervisor = threading.Thread(target=self._supervise, name="nbdist-supervisor", daemon=True)
                self._supervisor.start()

    def _supervise(self) -> None:
        """Look at the slots every LOOK_INTERVAL s until shutdown; never raises (a failed look is logged)."""
        while not self._closing.wait(LOOK_INTERVAL):
            try:
                self._round()
            except Exception as exc:  # a failed read must not end the watch
                logger.warning("nbdist: watching the followers: %r", exc)
            for s in list(self.slots()):
                try:
                    if s.down is None and self._watched(s):
                        ended = self._check(s)
                        if ended is not None:
                            self._died(s, ended)
                except Exception as exc:  # a look that failed must not end the watch over the others
                    logger.warning("nbdist: watching rank %d: %r", s.rank, exc)

    def _died(self, s: S, end: Ending) -> None:
        """Record how ``s``'s process ended, then start it again in its slot, or leave it down, as the policy says."""
        now = time.monotonic()
        decision = restarts.decide(s.restarts, now, self.max_restarts, s.joined)
        if decision.restart:
            why = self._cannot_restart(s)
            decision = decision if why is None else restarts.Decision(False, why)
        exit_ = Exit(time.time(), end.pid, end.how, end.rss_kb, end.lines, decision.restart, decision.why)
        s.exits.append(exit_)
        with self._lock:
            if self._closing.is_set():
                return  # shutdown() stops what is left of it
            self._tell(s.rank, exit_, restarts.in_window([*s.restarts, now], now), end.told)
            self._clean(s)
            if not decision.restart:
                s.down = decision.why
                s.note(f"nbdist: rank {s.rank} {end.how}; left down: {decision.why}")
                logger.warning("nbdist: rank %d %s; left down: %s. %s", s.rank, end.how, decision.why,
                               self.after_down)
                return
            s.restarts.append(now)
            n = restarts.in_window(s.restarts, now)
            s.note(f"nbdist: rank {s.rank} {end.how}; starting it again ({n} of {self.max_restarts})")
            logger.warning("nbdist: rank %d %s; starting it again (%d of %d)", s.rank, end.how, n,
                           self.max_restarts)
            self._reset(s)
            try:
                self._start(s)
            except Exception as exc:  # it could not start: left down, what started of it stopped
                why = f"it could not be started again: {type(exc).__name__}: {exc}"
                self._clean(s)
                if not self._closing.is_set():  # (else shutdown() has stopped the world; nothing to report)
                    s.down = why
                    s.exits[-1] = replace(s.exits[-1], restarted=False, why_down=why)
                    self._tell(s.rank, s.exits[-1], n, end.told)

    def _leave_down(self, s: S, why: str, pid: int | None, rss_kb: int | None, lines: tuple[str, ...]) -> None:
        """Leave ``s`` down without a death (its process runs but failed to join after a restart)."""
        with self._lock:
            if self._closing.is_set():
                return
            s.down = why
            s.exits.append(Exit(time.time(), pid, "did not join", rss_kb, lines, False, why))
            self._clean(s)

    def report_to(self, client: StoreClient, key: Callable[[str], str]) -> None:
        """From now on, say in the world's store how each follower's process that dies ended, and what became of its
        slot (:class:`nbdist.world.exited_record.Exited`, which the ranks that lose it read); ``client``: a connection
        of the supervisor's own, closed at shutdown; ``key``: the world's round's key of a name. It is called once
        the world formed: from then on every slot is watched (:meth:`_watched`)."""
        self._report = (client, key)

    def _tell(self, rank: int, exit_: Exit, n: int, lines: list[str]) -> None:
        """Publish how rank ``rank``'s process ended (``n``: its restarts within the window, this one counted;
        ``lines``: the last its process wrote)."""
        if self._report is None or exit_.pid is None:
            return
        client, key = self._report
        then = (f"rank {rank} was restarted ({n} of {self.max_restarts})" if exit_.restarted
                else f"rank {rank} was left down: {exit_.why_down}; {self.after_down}")
        told = Exited(exit_.pid, exit_.how, lines, exit_.restarted, then, exit_.at)
        try:
            client.set(key(keys.exited(rank)), told.to_json())
        except StoreConnectionError as exc:  # the world is going: nobody is left to tell
            logger.info("nbdist: could not say how rank %d ended: %s", rank, exc)

    def _unwatch(self) -> None:
        """Stop the watch (a restart under way ends first; none begins after); idempotent."""
        self._closing.set()
        with self._lock:
            pass
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=LOOK_INTERVAL + 15)
        report, self._report = self._report, None
        if report is not None:
            report[0].close()

    # --- what the driving notebook asks --------------------------------------------------------------------
    def restarted(self) -> list[int]:
        """The ranks whose process was started again, and runs (their namespace is new)."""
        return [s.rank for s in self.slots() if s.restarts and s.down is None]

    def restart_times(self) -> dict[int, list[float]]:
        """When (``time.monotonic()``) each rank's process was started again."""
        return {s.rank: list(s.restarts) for s in self.slots()}

    def slot_row(self, s: S) -> dict[str, Any]:
        """What %dist_workers shows of every kind of slot: its restarts and exits."""
        return {"down": s.down, "after_down": self.after_down, "exits": [e.line() for e in s.exits],
                "restarts": restarts.count(s.restarts, time.monotonic(), self.max_restarts)}
