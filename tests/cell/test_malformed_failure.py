"""A step's failure written into the store by hand, not by nbdist (anyone who reaches the port can): no reader takes
it for a failure, and the first real failure replaces it. Real server, real TCP, two worlds in one process."""

from __future__ import annotations

import json

import pytest

from nbdist.cell import turn, watch
from nbdist.world import keys, records
from nbdist.world.world import step_name

BODY = "x = RANK\n"
MALFORMED = ["garbage", "[]", json.dumps({"rank": 1, "kind": "error"}),
             json.dumps({"rank": "1", "kind": "error", "message": "m"}),
             json.dumps({"rank": 1, "kind": "error", "message": "m", "unstarted": 5})]


@pytest.fixture
def pair(two_worlds):
    return two_worlds  # (rank 0, rank 1), both just joined


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_failure_is_no_failure_and_the_first_real_one_replaces_it(pair, text):
    late, peer = pair
    n = late.turns.next()
    late.client.set(late.key(keys.failed(step_name(n - 1))), text)
    late.last_turn = n - 2  # it missed step n - 1: a real failure there would be a peer's unstarted cell
    turn.refuse_if_peer_did_not_start(late, n, BODY)  # does not raise: there is no failure
    assert late.turns.next() == n
    cell = step_name(n)
    peer.client.set(peer.key(keys.failed(cell)), text)
    mine = records.Failure(1, "error", "rank 1 (h, pid 2) raised KeyError: 'x'")
    assert watch.publish(peer.client, peer, cell, mine) == mine
    assert records.Failure.from_json(late.client.get_if(late.key(keys.failed(cell)))) == mine
    theirs = records.Failure(0, "interrupted", "rank 0 (h, pid 1) interrupted its cell")
    assert watch.publish(late.client, late, cell, theirs) == mine  # a real one stays: the first wins


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_failure_is_not_read_as_one_where_the_cell_is_watched(pair, text):
    late, _ = pair
    cell = step_name(late.turns.next())
    late.client.set(late.key(keys.failed(cell)), text)
    assert records.Failure.read(late.client.get_if(late.key(keys.failed(cell)))) is None
    # What the end of a cell publishes: the winner is this rank's own failure, which replaces it.
    mine = records.Failure(0, "error", "rank 0 (h, pid 1) raised KeyError: 'x'")
    assert watch.publish(late.client, late, cell, mine) == mine


def test_a_malformed_plain_cell_failure_is_none_and_a_real_one_after_it_is_found(pair):
    late, peer = pair
    n = peer.client.add(peer.key(keys.PLAIN_FAILED_N), 1)
    peer.client.set(peer.key(keys.plain_failed(n)), "garbage")
    assert watch.plain_failure(late.client, late, 0) is None
    watch.publish_plain_failure(peer.client, peer, "rank 1 (h, pid 2) ended its cell")
    assert watch.plain_failure(late.client, late, 0) == records.Failure(1, "error", "rank 1 (h, pid 2) ended its cell")
