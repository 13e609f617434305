"""Reaching a world's rendezvous server; rank 0 on the master's host starts it when nothing answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..config import TIMEOUTS, WorldConfig, is_local_address
from ..errors import JoinError, StoreConnectionError, TokenError
from . import netinfo, rendezvous
from .store import Server, StoreClient, connect, probe

TOKEN_GRACE = 15.0  # seconds a refused token is tried again (the server's rank may be restarting it, on a busy host)

_UNREACHABLE = {
    "refused": "connection to {addr} refused: nothing listens there. Run %%dist_init for rank 0 first "
               "(it starts the server), or `nbdist serve` on that host; check --master-addr/--master-port",
    "timeout": "no answer from {addr}: packets are dropped (a firewall or security group?). "
               "Open that TCP port on the master's host, or check --master-addr",
    "unreachable": "no route to {addr}: check --master-addr and this host's network",
}


def reach(cfg: WorldConfig, deadline: float, on_status: Callable[[Any], None] | None, server: Server | None,
          session: str) -> tuple[StoreClient, Server | None]:
    """A connection to the world's server, and the server this kernel hosts (rank 0 starts it if none answers)."""
    host, port = cfg.master_addr, cfg.master_port
    if server is not None and server.running and (server.host, server.port) != (host, port):
        server.stop()
        server = None
    elif server is not None and server.running and server.token != cfg.token:
        _restart_for_token(server, session)
        server = None
    local = is_local_address(host)
    token_refused: float | None = None
    cut: float | None = None
    while True:
        state = probe(host, port)
        if state == "open":
            holder = None
            if local and not (server is not None and server.running):
                holder = netinfo.port_holder(port)
            connect_timeout = min(TIMEOUTS["connect"], max(1.0, deadline - time.monotonic()))
            try:
                return connect(host, port, connect_timeout, token=cfg.token, holder=holder), server
            except TokenError as exc:
                # The server's notebook may be restarting it with this token right now (both re-ran
                # %%dist_init with a new one): try again for a few seconds before saying so.
                token_refused = _again(token_refused, exc, deadline, on_status,
                                       f"nbdist: {exc}; trying again for {TOKEN_GRACE:g} s, in case rank 0 is "
                                       "restarting its server with this notebook's token")
                time.sleep(0.5)
                continue
            except StoreConnectionError as exc:
                # It stopped answering while this rank connected: rank 0 may have closed it to start it again
                # with a new token, and this connection reached the old one as it went.
                cut = _again(cut, exc, deadline, on_status,
                             f"nbdist: {str(exc).split(';')[0]} while this notebook connected; trying again for "
                             f"{TOKEN_GRACE:g} s, in case rank 0 is restarting its server")
                time.sleep(0.2)
                continue
        if cfg.rank == 0 and state == "refused" and local:
            try:
                server = Server(host, port, token=cfg.token)
            except StoreConnectionError:
                if probe(host, port) != "open":
                    raise
            continue
        if time.monotonic() > deadline:
            raise StoreConnectionError(f"{_UNREACHABLE[state].format(addr=f'{host}:{port}')} "
                                       f"(waited {cfg.timeout:g} s)")
        if on_status is not None:
            on_status({"world_size": cfg.world_size, "joined": {}, "missing": list(range(cfg.world_size)),
                       "elapsed": cfg.timeout - (deadline - time.monotonic()), "server": state})
        time.sleep(0.5)


def _again(since: float | None, exc: Exception, deadline: float, on_status: Callable[[Any], None] | None,
           message: str) -> float:
    """When this kind of failure first came (``since``, kept): raise ``exc`` once it lasted TOKEN_GRACE or the
    deadline passed, else show ``message``."""
    now = time.monotonic()
    since = now if since is None else since
    if now - since > TOKEN_GRACE or now > deadline:
        raise exc
    if on_status is not None:
        on_status(message)
    return since


def _restart_for_token(server: Server, session: str) -> None:
    """A new token on the rank hosting the server takes effect: stop it (it starts again), if nobody else uses it."""
    address = f"{server.host}:{server.port}"
    client = connect(server.host, server.port, TIMEOUTS["connect"], token=server.token)
    try:
        others = rendezvous.live_peers(client, session)
    finally:
        client.close()
    if others:
        who = ", ".join(f"rank {o.rank} ({o.host}, pid {o.pid})" for o in others)
        was = "with another token" if server.token else "without a token"
        raise JoinError(
            f"this notebook hosts the rendezvous server at {address}, started {was}, and {who} still "
            "use(s) it: run %dist_destroy in those notebooks first, then re-run %%dist_init here and there"
        )
    server.stop()

