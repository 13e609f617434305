"""A joined kernel's watch over all its cells: stops of every rank, and whether it is busy running one.

One thread per world, polling every :data:`GUARD_INTERVAL`. It publishes under
``busy/<rank>`` whether this kernel runs a cell (so a barrier elsewhere can
tell a rank at work from an absent one), and follows ``stops``, the counter
that ``%dist_stop`` and ``nbdist stop`` raise: a new stop, while a cell runs
here, is handed to ``on_stop``. Plain cells pay nothing for it: the running
flag is set without any I/O, and published from this thread.

A stop is for the cell that ran when it was sent, never for the next one: a
cell that ends early (its peers stopped first) may be followed by another
before this thread looks again. A stop first seen in a cell this thread saw
running at its previous look was sent during that cell; one first seen in a
cell that started since is taken only if it was sent after that cell began
(the stop's time, and the cell's on this host's clock: a difference between
the hosts' clocks can matter only within one look, 0.2 s).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import StoreConnectionError
from ..world import keys
from ..world.records import Busy, MalformedRecord, StopAll
from ..world.store import StoreClient

log = logging.getLogger(__name__)

GUARD_INTERVAL = 0.2  # seconds between looks at the stop counter


def request_stop(client: StoreClient, round_: int, by: str, session: str = "") -> int:
    """Ask every rank of world round ``round_`` to stop its running cell; returns the stop's number."""
    n = client.add(keys.in_round(round_, keys.STOPS), 1)
    client.set(keys.in_round(round_, keys.stop(n)), StopAll(f"stopped by {by}", session, time.time()).to_json())
    return n


class Guard:
    """Watches one kernel's cells for a world (see the module docstring); ``stop()`` is idempotent."""

    def __init__(self, client: StoreClient, key: Callable[[str], str], rank: int, session: str,
                 on_stop: Callable[[StopAll], None], start: bool = True) -> None:
        self._client, self._key, self._rank, self._session, self._on_stop = client, key, rank, session, on_stop
        self.running = False  # a cell of this kernel runs (set by the session's cell events)
        self.cell = 0  # which cell of this kernel runs: a new number for each (set with ``running``)
        self.cell_started = 0.0  # when it began, time.time() (set with ``running``)
        self._looked_at: int | None = None  # the cell that ran at the previous look, if any
        self._published: bool | None = None
        self._seen = self._client.add(key(keys.STOPS), 0)  # stops from before this kernel joined are not for it
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbdist-guard", daemon=True)
        if start:  # without: the caller looks itself (tests)
            self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(GUARD_INTERVAL):
            try:
                self._look()
            except StoreConnectionError as exc:
                log.info("nbdist guard stopped: %s", exc)
                return
            except Exception:  # never let the guard die silently of a bug: say so and go on
                log.exception("nbdist guard")

    def _look(self) -> None:
        running, cell, started = self.running, self.cell, self.cell_started
        if running != self._published:
            self._client.set(self._key(keys.busy(self._rank)), Busy(running, time.time()).to_json())
            self._published = running
        seen_running = running and self._looked_at == cell  # this cell ran at the previous look too
        n = self._client.add(self._key(keys.STOPS), 0)
        while self._seen < n:
            text = self._client.get_if(self._key(keys.stop(self._seen + 1)))
            if text is None:
                return  # counted, not yet described: look again next time (this cell counts as seen then)
            self._seen += 1
            try:
                stop = StopAll.from_json(text)
            except MalformedRecord as exc:  # anyone can write there: not a stop nbdist sent
                log.warning("nbdist guard: stop #%d is not a stop (%s); ignored", self._seen, exc)
                continue
            for_this_cell = seen_running or stop.t >= started
            if running and self.running and self.cell == cell and for_this_cell and stop.session != self._session:
                self._on_stop(stop)
        self._looked_at = cell if running else None

    def new_cell(self) -> None:
        """A cell begins here (no I/O: plain cells pay nothing for the guard)."""
        self.cell, self.cell_started = self.cell + 1, time.time()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._client.close()
