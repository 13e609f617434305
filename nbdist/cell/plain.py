"""The safety net of a plain cell (no %%collective) that calls a collective.

At its first collective the cell gets a process group it can trust (rebuilt
with every rank if it cannot, as at a %%collective's start) and a
:class:`~nbdist.cell.watch.CellWatch`, so a lost or failed rank ends it instead of
leaving it waiting; the watch ends with the cell.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..config import TIMEOUTS
from ..errors import DriveError, StoreConnectionError
from .fingerprint import Checker
from .watch import CellWatch, plain_failures, publish_plain_failure

log = logging.getLogger(__name__)


class PlainNet:
    """One kernel's plain-cell watcher (see the module docstring)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.watch: CellWatch | None = None
        self._cells = 0

    def checker(self) -> Checker | None:
        """At a plain cell's first collective: a trusted group, a watcher, and the cell's checker."""
        s = self.session
        world = s.world
        if world is None or s.watch_client is None or threading.current_thread() is not threading.main_thread():
            return None
        if s.drive.has_followers(world):
            raise DriveError("this notebook drives the world, and its followers run only %%collective cells: a "
                             "collective in a plain cell would wait for them forever. Put it in a %%collective "
                             "cell, or run %dist_release first")
        s.ensure_group()
        self._cells += 1
        cell = f"g{world.gen}/plain/{world.rank}/{self._cells}"
        checker = Checker(world, cell, TIMEOUTS["barrier"], s.hooks.params, compare=False, plain=True)
        watch = CellWatch(world, s.watch_client, cell, checker, "this cell", stopper=s.stopper, plain=True,
                          plain_since=plain_failures(world.client, world))
        watch.__enter__()
        self.watch, s.hooks.active = watch, checker
        return checker

    def end(self, error: BaseException | None = None) -> None:
        """The plain cell ended (with ``error``, if it failed): stop its watch; a group it broke is rebuilt by
        every rank at its next use. A cell that failed of its own accord during its collectives tells the
        others' plain cells, so that none waits in a collective this rank will not join."""
        s = self.session
        watch, self.watch = self.watch, None
        if watch is None:
            return
        if s.hooks.active is watch.checker:
            s.hooks.active = None
        watch.__exit__(None, None, None)
        world = s.world
        if world is None:
            return
        pg = world.pg
        try:
            world.note("finished a plain cell's collectives")  # its watch noted what it was inside: no longer
            own = watch.reason is None or watch.reason.get("rank") == world.rank
            if error is not None and own:
                why = "the stop button" if type(error) is KeyboardInterrupt else f"{type(error).__name__}: {error}"
                publish_plain_failure(world.client, world, f"{world.describe(world.rank)} ended its cell during its "
                                                           f"collectives ({why})")
            if pg is not None and pg.broken and pg.gen == world.gen:
                world.bump_generation(pg.gen)  # the others rebuild at their next cell that uses it, too
        except StoreConnectionError as exc:
            log.info("could not tell the others this plain cell ended: %s", exc)
