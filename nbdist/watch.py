"""A watcher beside a running %%collective body: it ends a stuck collective for a reason.

While the body runs on the kernel's main thread, this thread watches, every
0.1 s, for: another rank's failure in this cell (its ``failed`` key), a rank
whose heartbeat stopped, the rendezvous server going away, and the stop
button. SIGINT cannot interrupt a blocking collective, so the watcher sees it
through ``signal.set_wakeup_fd`` and *cuts* the process group (see
:mod:`nbdist.procgroup`): the pending collective fails at once on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import threading
from typing import Any

from .config import POLL_INTERVAL
from .errors import NbdistError, PeerLostError, StoreConnectionError
from .store import StoreClient
from .world import World, bump_generation

log = logging.getLogger(__name__)


def publish_failure(client: StoreClient, world: World, cell: str, info: dict[str, Any]) -> dict[str, Any]:
    """Record the first failure of a cell (first one wins) and ask for a new process group."""
    first = client.compare_set(world.key(f"{cell}/failed"), "", json.dumps(info))
    bump_generation(client, world.key("gen"), world.gen)
    return json.loads(first)


class CellWatch:
    """Watches one cell of one rank; :attr:`reason` says why it cut the process group, if it did."""

    def __init__(self, world: World, client: StoreClient, cell: str) -> None:
        self.world, self.client, self.cell = world, client, cell
        self.reason: dict[str, Any] | None = None
        self.interrupted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbdist-watch", daemon=True)
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._old_wakeup: int | None = None

    def __enter__(self) -> CellWatch:
        if threading.current_thread() is threading.main_thread():
            self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        os.write(self._write_fd, b"\0")  # wake the select
        self._thread.join(timeout=5)
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _run(self) -> None:
        failed_key = self.world.key(f"{self.cell}/failed")
        while not self._stop.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], POLL_INTERVAL)
            if ready:
                data = os.read(self._read_fd, 64)
                self._forward(data)
                if signal.SIGINT in data:
                    self.interrupted = True
                    self._cut({"rank": self.world.rank, "kind": "interrupted",
                               "message": f"{self.world.describe(self.world.rank)} interrupted its cell"})
                    return
            if self._stop.is_set():
                return
            try:
                text = self.client.get_if(failed_key)
                if text is not None:
                    info = json.loads(text)
                    if info["rank"] != self.world.rank:
                        self._cut(info, publish=False)
                        return
                self.world.check_peers(self.client)
            except PeerLostError as exc:
                self._cut({"rank": -1, "kind": "lost", "message": str(exc)})
                return
            except StoreConnectionError as exc:
                self._cut({"rank": -1, "kind": "server", "message": str(exc)}, publish=False)
                return
            except NbdistError as exc:
                log.warning("nbdist watcher: %s", exc)

    def _forward(self, data: bytes) -> None:
        """Hand signal bytes on to the previous wakeup fd (the event loop's), minus our own wake-up."""
        data = data.replace(b"\0", b"")
        if data and self._old_wakeup not in (None, -1):
            try:
                os.write(self._old_wakeup, data)
            except OSError as exc:
                log.debug("could not forward signal bytes: %s", exc)

    def _cut(self, info: dict[str, Any], publish: bool = True) -> None:
        self.reason = info
        if publish:
            try:
                publish_failure(self.client, self.world, self.cell, info)
            except StoreConnectionError as exc:
                log.info("could not tell the others: %s", exc)
        if self.world.pg is not None:
            self.world.pg.cut()
