"""One kernel's link to the store: the server it hosts, its connections, its heartbeat and its world.

The session holds one :class:`StoreLink` for the kernel's life. Joining a world reaches the server (rank 0
starts it if none answers: :mod:`nbdist.world.reach`), starts the heartbeat and registers this rank
(:mod:`nbdist.world.rendezvous`); leaving tells the others and closes the connections, but keeps a hosted
server running for the next world, until :meth:`StoreLink.close`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..config import TIMEOUTS, WorldConfig
from ..errors import NotInitializedError, StoreConnectionError
from . import reach, rendezvous
from .heartbeat import Heartbeat
from .records import Registration
from .store import Server, StoreClient, connect
from .world import World

log = logging.getLogger(__name__)

EXIT_GRACE = 3.0  # seconds a kernel that hosts the server keeps serving at exit while other ranks still use it


def sync_generation(world: World, gen: int | None = None) -> int:
    """Follow the world to a new generation (a rank was replaced): renumber, re-read ranks.

    The process group stays until the next cell that uses it rebuilds it. Returns the generation.
    ``gen``: the store's generation, where the caller knows it (a follower, from its driver's message).
    """
    gen = world.generations.stored() if gen is None else gen
    if gen != world.gen:
        world.enter_generation(gen)
    return gen


class StoreLink:
    """See the module docstring. ``session`` (below): this kernel's session id, under which it registers and beats."""

    def __init__(self) -> None:
        self.server: Server | None = None
        self.client: StoreClient | None = None
        self.world: World | None = None
        self.watch_client: StoreClient | None = None
        self.heartbeat: Heartbeat | None = None

    def require_world(self, what: str) -> World:
        if self.world is None:
            raise NotInitializedError(what)
        return self.world

    def host(self, server: Server) -> None:
        """Host ``server`` from now on (a ``--spawn``'s, started on the port its plan held); one this kernel hosted
        before stops, as :func:`nbdist.world.reach.reach` stops it for a world at another address."""
        if self.server is not None and self.server is not server:
            self.server.stop()
        self.server = server

    def reach(self, cfg: WorldConfig, deadline: float, on_status: Callable[[Any], None] | None,
              session: str) -> StoreClient:
        """Connect to ``cfg``'s server (hosting it on rank 0 if none answers), and start beating there."""
        self.client, self.server = reach.reach(cfg, deadline, on_status, self.server, session)
        self.heartbeat = Heartbeat(self.client.clone(op_timeout=5.0), session, cfg.rank)
        self.watch_client = self.client.clone(op_timeout=5.0)
        return self.client

    def join(self, me: Registration, cfg: WorldConfig, on_status: Callable[[Any], None] | None,
             deadline: float) -> World:
        """Register ``me`` and wait for every rank (:func:`nbdist.world.rendezvous.join`); the world formed."""
        assert self.client is not None
        self.world = rendezvous.join(self.client, me, cfg.world_size, cfg.timeout, on_status, deadline=deadline)
        return self.world

    def leave_world(self) -> None:
        """Tell the others this rank left, and cut and destroy its process group: nothing may still wait on it."""
        if self.world is None:
            return
        try:
            self.world.leave()
        except StoreConnectionError as exc:
            log.info("could not tell the others this rank left: %s", exc)
        if self.world.pg is not None:
            self.world.pg.cut("left")  # nothing may still wait on it, or destroying it would hang
            self.world.pg.destroy()
        self.world = None

    def disconnect(self) -> None:
        """Close this rank's connections and stop its heartbeat; idempotent. A hosted server runs on."""
        if self.watch_client is not None:
            self.watch_client.close()
            self.watch_client = None
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self.client is not None:
            self.client.close()
            self.client = None

    def serve_out(self, session: str) -> None:
        """Kernel exit, after leaving: keep a hosted server up while other ranks still use it, up to EXIT_GRACE."""
        server = self.server
        if server is None or not server.running:
            return
        deadline = time.monotonic() + EXIT_GRACE
        try:
            client = connect(server.host, server.port, TIMEOUTS["connect"], token=server.token)
            try:
                while time.monotonic() < deadline and rendezvous.live_peers(client, session):
                    time.sleep(0.1)
            finally:
                client.close()
        except StoreConnectionError as exc:
            log.info("at exit, could not see whether other ranks still use the server: %s", exc)

    def stop_server(self) -> None:
        """Stop the server this kernel hosts, if it does; idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None
