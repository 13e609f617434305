"""A real store for the debug protocols' tests, its token the test module's ``TOKEN``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nbdist.world.store import Server, StoreClient, connect

from ..conftest import free_port


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[StoreClient]:
    token = request.module.TOKEN
    server = Server("127.0.0.1", free_port(), token=token)
    try:
        c = connect("127.0.0.1", server.port, token=token)
        try:
            yield c
        finally:
            c.close()
    finally:
        server.stop()
