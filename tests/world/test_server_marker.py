"""The server's marker, read as a client connects: what it holds decides whether the server is nbdist's. Real
server, real TCP."""

from __future__ import annotations

import pytest

from nbdist.errors import NotNbdistServerError
from nbdist.world import keys
from nbdist.world.store import verify


def test_a_server_marker_that_is_not_a_json_object_is_no_nbdist_server(two_worlds):
    """Anyone who reaches the port can write the marker: text that is not nbdist's marker is refused as a server that
    is not nbdist's, never returned for a later ``.get`` to fail on."""
    waiting, _ = two_worlds
    assert verify(waiting.client).get("pid") is not None  # the real marker
    for text in ("[1]", "not json", '"a string"'):
        waiting.client.set(keys.SERVER, text)
        with pytest.raises(NotNbdistServerError, match="not an nbdist server"):
            verify(waiting.client, grace=0.1)
