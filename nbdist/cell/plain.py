"""The safety net of a plain cell (no %%collective) in a formed world.

Its :class:`~nbdist.cell.watch.CellWatch` starts with the cell and waits for
the stop button, and, once the cell started a collective (one nbdist wraps, or
one torch's own code starts from C++, by torch's count: :mod:`nbdist.cell.inflight`),
for a lost or failed rank, so that none leaves the cell waiting; the watch ends
with the cell. At its first wrapped collective the cell gets a process group it
can trust (rebuilt with every rank if it cannot, as at a %%collective's start).
A driving notebook refuses a collective in a plain cell: its followers never
join it (one that torch's own code started is cut as soon as it is seen).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..config import TIMEOUTS
from ..errors import DriveError, StoreConnectionError
from ..world.store import StoreClient
from ..world.world import World
from .fingerprint import Checker
from .hooks import Collectives
from .inflight import Since
from .stopper import Stopper
from .watch import CellWatch, publish_plain_failure

log = logging.getLogger(__name__)

DRIVING = ("this notebook drives the world, and its followers run only %%collective cells: a collective in a "
           "plain cell would wait for them forever. Put it in a %%collective cell, or run %dist_release first")
FOLLOWING = ("other ranks of this world are `nbdist follow` processes, which run only a driving notebook's "
             "%%collective cells: a collective in a plain cell would wait for them forever. Put it in a %%collective "
             "cell (this notebook then drives them)")


def watched(raw: str) -> bool:
    """Whether a cell is a plain one to watch: not a %%collective, nor one of nbdist's magics (they run turns)."""
    first = raw.lstrip().partition("\n")[0]
    return not first.startswith(("%%collective", "%%dist_", "%dist_"))


def distributed_failure(error: BaseException) -> bool:
    """Whether ``error`` came from torch.distributed's backend (a timeout, a closed connection)."""
    import torch.distributed as dist

    return isinstance(error, getattr(dist, "DistError", ())) or "gloo" in str(error)


class Driving(Protocol):
    """Whether this notebook drives, and whether other ranks run only a driver's cells (followers, ``nbdist follow``
    processes): :class:`nbdist.drive.follow.Drive`, a layer above this one."""

    holding: bool

    def has_followers(self, world: World) -> bool: ...


class Linked(Protocol):
    """Where the kernel's world is, and its watchers' connection (:class:`nbdist.world.link.StoreLink`)."""

    @property
    def world(self) -> World | None: ...

    @property
    def watch_client(self) -> StoreClient | None: ...


class DriveSide(Protocol):
    """What runs this rank (a kernel, or ``nbdist follow``), and its drive (:class:`nbdist.drive.driving.KernelDrive`,
    a layer above this one)."""

    @property
    def process(self) -> str: ...

    @property
    def drive(self) -> Driving: ...


class PlainNet:
    """One kernel's plain-cell watcher (see the module docstring)."""

    def __init__(self, link: Linked, hooks: Collectives, stopper: Stopper, driving: DriveSide,
                 ensure_group: Callable[[], str | None]) -> None:
        """``ensure_group``: rebuild the process group with every rank if it cannot be trusted
        (:func:`nbdist.cell.rebuild.ensure`)."""
        self.link, self.hooks, self.stopper, self.driving = link, hooks, stopper, driving
        self.ensure_group = ensure_group
        self.watch: CellWatch | None = None
        self._cells = 0
        self._reached = False  # the running cell reached a collective of its own: the others may wait in theirs

    def _refusal(self) -> DriveError | None:
        if self.link.world is None or not self.driving.drive.has_followers(self.link.world):
            return None
        return DriveError(DRIVING if self.driving.drive.holding else FOLLOWING)

    def begin(self, raw: str) -> None:
        """A cell of the user begins: a plain one in a formed world is watched from now (the stop button)."""
        world, drive = self.link.world, self.driving.drive
        if (world is None or self.link.watch_client is None or self.watch is not None
                or self.driving.process != "kernel" or not watched(raw)
                or threading.current_thread() is not threading.main_thread()):
            return
        driven = drive.holding or drive.has_followers(world)  # may drive a collective that torch's code starts
        self._reached = False
        self._start(plain_since=None, since=Since(), refuse=self._refusal if driven else None)

    def _start(self, **kwargs: Any) -> CellWatch:
        world, client = self.link.world, self.link.watch_client
        assert world is not None and client is not None, "a plain cell is watched in a formed world"
        self._cells += 1
        cell = f"g{world.gen}/plain/{world.rank}/{self._cells}"
        checker = Checker(world, cell, TIMEOUTS["barrier"], self.hooks.params, compare=False, plain=True)
        watch = CellWatch(world, client, cell, checker, "this cell", stopper=self.stopper, plain=True, **kwargs)
        watch.__enter__()
        self.watch = watch
        return watch

    def checker(self) -> Checker | None:
        """At a plain cell's first collective: a trusted group, a watcher, and the cell's checker."""
        world = self.link.world
        if world is None or self.link.watch_client is None or threading.current_thread() is not threading.main_thread():
            return None
        # From here the others may wait for this rank in their collective, while a stop can still land before
        # torch's count moves (nbdist's store reads below; past a rebuild every rank took part in, a stop held
        # through it is raised as it ends): a cell that ends now tells them, as one inside its collectives does.
        self._reached = True
        refused = self._refusal()
        if refused is not None:
            self._reached = False  # a driving notebook's world: nobody waits in a plain cell's collective
            raise refused
        self.ensure_group()
        watch = self.watch or self._start(plain_since=None)
        self.hooks.active = watch.checker
        return watch.checker

    def end(self, error: BaseException | None = None) -> None:
        """The plain cell ended (with ``error``, if it failed): stop its watch; a group it broke is rebuilt by
        every rank at its next use. A cell that failed of its own accord once it reached its collectives tells
        the others' plain cells, so that none waits in a collective this rank will not join."""
        watch, self.watch = self.watch, None
        reached, self._reached = self._reached, False
        if watch is None:
            return
        if self.hooks.active is watch.checker:
            self.hooks.active = None
        watch.__exit__(None, None, None)
        world = self.link.world
        if world is None or not (reached or watch.in_use()):
            return  # it reached no collective: nothing to tell, nothing broken
        pg = world.pg
        try:
            world.notes.write("finished a plain cell's collectives")  # its watch noted what it was inside: no longer
            own = watch.reason is None or watch.reason.rank == world.rank
            if error is not None and own:
                why = "the stop button" if type(error) is KeyboardInterrupt else f"{type(error).__name__}: {error}"
                publish_plain_failure(world.client, world, f"{world.describe(world.rank)} ended its cell during its "
                                                           f"collectives ({why})")
            if pg is not None and error is not None and distributed_failure(error):
                pg.distrust(f"a collective of a plain cell failed ({type(error).__name__})")  # torch's own, too
            if pg is not None and pg.broken and pg.gen == world.gen:
                world.generations.bump(pg.gen)  # the others rebuild at their next cell that uses it, too
        except StoreConnectionError as exc:
            log.info("could not tell the others this plain cell ended: %s", exc)
