"""Where every rank was while a ``%%collective`` hung, for the message the cell ends with (issue 36, item 3).

Once this rank has waited :data:`STUCK_AFTER` seconds in one place (inside a collective, nbdist's or torch's
own, at a comparison of collectives, or at the cell's end for the others), it asks every rank where it is,
as ``%dist_where`` does (:func:`nbdist.debug.where.ask`), from a short-lived thread, and keeps the report;
again every :data:`AGAIN_AFTER` seconds while it waits on. If the cell then ends badly (the stop button,
``--timeout``, ``--max-time``, a rank's failure or a mismatch), the cell's table ends with that report: the
merged stacks and torch's Flight Recorder per group, so the message names the collective, its group and the
missing ranks, also for collectives nbdist's wrappers never see (DDP's, FSDP's, ``new_group`` groups').
A cell that does not wait that long asks nothing; a driven rank (a follower) never asks: its driving
notebook shows the table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..world.world import World
from . import report, where

log = logging.getLogger(__name__)

STUCK_AFTER = 5.0  # seconds in one wait before this rank asks where every rank is
AGAIN_AFTER = 30.0  # seconds before it asks again, while it waits on
ANSWER_WAIT = 5.0  # seconds it waits for the answers (each rank answers within a heartbeat, 0.5 s)


class Hang:
    """One cell on one rank: asks where every rank is once it waits long, and keeps the report."""

    def __init__(self, world: World, key: Callable[[], bytes | None],
                 stuck_since: Callable[[], float | None] = lambda: None) -> None:
        self.world, self.key = world, key  # the world's key, taken when it asks (a key costs a millisecond)
        self.stuck_since = stuck_since  # since when this rank waits in one place (None: it does not wait)
        self._asked_at: float | None = None  # monotonic time of the last ask
        self._thread: threading.Thread | None = None
        self._report: tuple[str, float] | None = None  # (the report, when it was asked: monotonic)

    def tick(self) -> None:
        """Called every poll slice (the watcher's, then the cell's end): ask if stuck long enough."""
        since = self.stuck_since()
        now = time.monotonic()
        if since is None or now - since < STUCK_AFTER:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        if self._asked_at is not None and self._asked_at >= since and now - self._asked_at < AGAIN_AFTER:
            return  # asked during this wait, not long ago
        self._asked_at = now
        self._thread = threading.Thread(target=self._ask, args=(now,), name="nbdist-hang", daemon=True)
        self._thread.start()

    def _ask(self, at: float) -> None:
        world = self.world
        key = self.key()
        if key is None:
            return  # no key to sign the request with: the world has no token and no key file here
        client = world.client.clone(op_timeout=5.0)
        try:
            got = where.ask(client, world.round, world.world_size, key, timeout=ANSWER_WAIT,
                            by=f"{world.describe(world.rank)}, stuck in a cell")
            text = report.text(got.answers, got.silent, world.world_size, world.describe, seconds=got.seconds)
            self._report = (text, at)
        except Exception as exc:  # noqa: BLE001 (a report is a help: the cell goes on without one)
            log.info("nbdist: could not ask where every rank is: %s", exc)
        finally:
            client.close()

    def text(self) -> str | None:
        """The last report, headed by when it was asked; None if none was."""
        if self._report is None:
            return None
        text, at = self._report
        ago = time.monotonic() - at
        body = text.split("\n", 1)[1].lstrip("\n") if "\n" in text else text
        return f"nbdist: where every rank was {ago:.0f} s before the cell ended (as %dist_where shows it):\n{body}"
