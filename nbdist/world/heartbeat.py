"""A rank's heartbeat in the store, fed by the kernel and beaten by its pulse process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..config import HEARTBEAT_INTERVAL
from ..errors import StoreConnectionError
from . import keys, records
from .pulse import STOPPED, Beat, Pulse
from .store import StoreClient

log = logging.getLogger(__name__)


class Heartbeat:
    """Proves this kernel is alive: its pulse process beats in the store, and this thread feeds it.

    The pulse (:mod:`nbdist.world.pulse`) keeps beating while the kernel's Python is
    busy in one long C call, and says "gone" when the kernel dies. Until its
    first beat shows (about 0.1 s), or if it cannot run, this thread writes
    the beats itself, as a plain heartbeat.
    """

    def __init__(self, client: StoreClient, session: str, rank: int) -> None:
        self._client, self._key, self._rank = client, keys.heartbeat(session), rank
        self._stop = threading.Event()
        self._leaving = threading.Lock()
        self._last_is_mine = False  # the thread leaves the last beat: stop() no longer waited for it
        self._chores: list[Callable[[StoreClient], None]] = []
        self.pulse: Pulse | None = None
        try:
            self.pulse = Pulse.start(client.host, client.port, self._key, rank)
        except OSError as exc:
            log.warning("nbdist: no heartbeat process (%s); liveness falls back to a thread, which a long C call "
                        "holding the GIL stops", exc)
        self._thread = threading.Thread(target=self._run, name="nbdist-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._beat()
        finally:
            with self._leaving:  # asked to stop while this thread still ran: the last beat is its, after its own
                if self._last_is_mine:
                    self._leave()

    def _beat(self) -> None:
        n, pulsing = 0, False
        while not self._stop.is_set():
            pulse = self.pulse
            try:
                if pulse is not None and pulse.running:
                    pulse.beat()
                    if not pulsing:  # the pulse's first beat shows (one that is not a beat is not its)
                        beat = records.or_none(Beat.from_json, self._client.get_if(self._key))
                        pulsing = beat is not None and beat.pulse == pulse.pid
                elif pulsing:
                    log.warning("nbdist: the heartbeat process ended (%s); this thread beats instead",
                                pulse.error() if pulse is not None else "")
                    pulsing = False
                if not pulsing:
                    n += 1
                    self._client.set(self._key, Beat(-n, time.time(), rank=self._rank).to_json())
                for chore in list(self._chores):
                    self._do(chore)
            except StoreConnectionError as exc:
                log.warning("nbdist heartbeat stopped: %s", exc)
                return
            self._stop.wait(HEARTBEAT_INTERVAL / 2)

    def add_chore(self, chore: Callable[[StoreClient], None]) -> None:
        """Run ``chore(client)`` at every beat, in this thread, with its store connection: it must be cheap (one
        store operation, say) and hand anything longer to a thread of its own."""
        self._chores.append(chore)

    def _do(self, chore: Callable[[StoreClient], None]) -> None:
        try:
            chore(self._client)
        except StoreConnectionError:
            raise
        except Exception:  # a chore's bug must not stop the heartbeat
            log.exception("nbdist heartbeat: a chore failed")

    def stop(self) -> None:
        """Stop beating (the pulse too, without it saying "gone") and leave a last beat that no longer moves, never
        removed: a peer reads the beats it has seen in one ``multi_get`` (:class:`nbdist.world.liveness.PeerTracker`),
        which would wait for a removed one. Idempotent.

        If the thread is still in a store operation (or not given the processor) after two intervals, this returns
        and the thread leaves the last beat when it returns: one written from here could land before the thread's
        own, which would look alive."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2 * HEARTBEAT_INTERVAL)
        if self.pulse is not None:
            self.pulse.stop()
        with self._leaving:
            if self._thread.is_alive():
                log.warning("nbdist: the heartbeat thread is still busy after %g s; it leaves its last beat when "
                            "it returns", 2 * HEARTBEAT_INTERVAL)
                self._last_is_mine = True
                return
            self._leave()

    def _leave(self) -> None:
        """Write the stopped beat and close the connection (under ``_leaving``, the pulse stopped)."""
        try:
            self._client.set(self._key, Beat(STOPPED, time.time(), rank=self._rank).to_json())
        except StoreConnectionError:
            log.debug("server gone; last heartbeat not written")
        self._client.close()
