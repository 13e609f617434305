"""A rank connecting while the server's rank restarts its server for a new token (both re-ran %%dist_init with
``--token``): its connection reaches the old server as it closes. Replayed at the one point where it happened,
between the TCP connection and the first store call (the check of the server's marker). Real servers, real TCP."""

from __future__ import annotations

import pytest

from nbdist.config import WorldConfig
from nbdist.errors import StoreConnectionError
from nbdist.world import reach, store
from nbdist.world.store import Server

HOST = "127.0.0.1"


class Restarts:
    """Before the marker check of a connection, the server closes and starts again with ``token`` (``times`` times)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, server: Server, token: str, times: int) -> None:
        self.servers = [server]
        self.token, self.left = token, times
        real = store.verify

        def verify(client: store.StoreClient, grace: float = 2.0) -> dict:
            if self.left:
                self.left -= 1
                self.servers[-1].stop()
                self.servers.append(Server(HOST, server.port, token=token))
            return real(client, grace)

        monkeypatch.setattr(store, "verify", verify)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def restarts(monkeypatch, port):
    made: list[Restarts] = []

    def make(times: int) -> Restarts:
        made.append(Restarts(monkeypatch, Server(HOST, port), "s3cret", times))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def rank_1(port: int, timeout: float = 30.0) -> WorldConfig:
    return WorldConfig(rank=1, world_size=2, master_addr=HOST, master_port=port, timeout=timeout, token="s3cret")


def test_the_rank_connects_again_and_reaches_the_restarted_server(restarts, port):
    r = restarts(1)
    told: list[object] = []
    client, hosted = reach.reach(rank_1(port), reach.time.monotonic() + 30, told.append, None, "s1")
    try:
        assert hosted is None and len(r.servers) == 2
        assert client.marker["auth"] is not None  # the new server's marker: it asks for the token
        client.set("x", "1")
        assert client.get("x") == "1"
        assert any("stopped answering" in str(t) and "restarting its server" in str(t) for t in told), told
    finally:
        client.close()


def test_a_server_that_keeps_cutting_the_connection_is_named_after_the_grace(restarts, port, monkeypatch):
    monkeypatch.setattr(reach, "TOKEN_GRACE", 1.0)
    r = restarts(10_000)
    with pytest.raises(StoreConnectionError, match=f"the rendezvous server at {HOST}:{port} stopped answering"):
        reach.reach(rank_1(port), reach.time.monotonic() + 30, None, None, "s1")
    assert len(r.servers) > 2  # it tried again before it said so
