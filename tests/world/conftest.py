"""Fixtures of the world's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nbdist.world.store import Server, StoreClient, connect


@pytest.fixture
def client(port: int) -> Iterator[StoreClient]:
    """A connection to a real server on loopback, for this test alone."""
    server = Server("127.0.0.1", port)
    client = connect("127.0.0.1", port)
    yield client
    client.close()
    server.stop()
