"""A rank's registration (``r/<n>/rank/<i>``) is validated where it is read: what nbdist writes reads back as
written, anything else is no registration, and a slot that holds one is taken by the rendezvous as a claim held by
no one alive, never a ``KeyError`` in the join. Real server, real TCP for the join."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nbdist.errors import JoinError
from nbdist.world import keys, rendezvous
from nbdist.world.records import MalformedRecord, Registration
from nbdist.world.store import Server, connect
from nbdist.world.world import read_ranks

# As Session.init writes it (then with its nonce), and as route_around_tunnel writes it again.
WRITTEN = Registration(
    session="k-0", rank=0, host="vm", pid=4242, process="kernel", node="node-a", addr="10.0.0.2",
    addrs=["10.0.0.2", "192.168.1.4"], nbdist="0.9.0", torch="2.5.1", python="3.11.9", backend="gloo",
    backend_reason="no accelerator: gloo", device="cpu", device_chosen=False, torch_npu=None, cann=None,
    agreed={"backend": "gloo"}, env=["GLOO_SOCKET_IFNAME=eth0  # nbdist"], keeps_beat=True, nonce="ab12")
FOLLOWER = replace(WRITTEN, session="k-1", rank=1, process="nbdist follow", device="npu:1", device_chosen=True,
                   torch_npu="2.5.1", cann="8.0.0", nonce="")
ESSENTIAL = {"session": "k-0", "rank": 0, "host": "vm", "pid": 4242}


@pytest.mark.parametrize("registration", [WRITTEN, FOLLOWER], ids=["kernel", "nbdist follow"])
def test_every_registration_nbdist_writes_reads_back_as_written(registration):
    assert Registration.from_json(registration.to_json()) == registration
    assert Registration.read(registration.to_json()) == registration
    assert json.loads(registration.to_json()) == registration.as_dict()


def test_a_registration_of_the_version_before_reads_with_defaults_and_extra_fields_are_read_past():
    old = {k: v for k, v in WRITTEN.as_dict().items() if k != "keeps_beat"}
    assert Registration.from_json(json.dumps({**old, "later": [1]})) == replace(WRITTEN, keeps_beat=False)
    assert Registration.from_json(json.dumps(ESSENTIAL)) == Registration("k-0", 0, "vm", 4242)


@pytest.mark.parametrize(("text", "why"), [
    ("not json", "not a JSON object"),
    ("[1, 2]", "not a JSON object"),
    ('"k-0"', "not a JSON object"),
    (json.dumps({"rank": 0, "host": "vm", "pid": 1}), "it has no 'session'"),
    (json.dumps({**ESSENTIAL, "session": 7}), "its 'session' is 7, not text"),
    (json.dumps({**ESSENTIAL, "rank": "0"}), "its 'rank' is \"0\", not a whole number"),
    (json.dumps({**ESSENTIAL, "pid": True}), "its 'pid' is true, not a whole number"),
    (json.dumps({k: v for k, v in ESSENTIAL.items() if k != "host"}), "it has no 'host'"),
    (json.dumps({**ESSENTIAL, "keeps_beat": "yes"}), "its 'keeps_beat' is \"yes\", not true or false"),
    (json.dumps({**ESSENTIAL, "addrs": "10.0.0.2"}), "its 'addrs' is \"10.0.0.2\", not a list"),
    (json.dumps({**ESSENTIAL, "agreed": {"backend": 1}}), "its 'agreed'['backend'] is 1, not text"),
    (json.dumps({**ESSENTIAL, "env": [1]}), "its 'env'[0] is 1, not text"),
    (json.dumps({**ESSENTIAL, "cann": 8}), "its 'cann' is 8, not text"),
    (json.dumps({**ESSENTIAL, "device_chosen": 0}), "its 'device_chosen' is 0, not true or false"),
])
def test_what_is_not_a_registration_raises_naming_why_and_reads_as_none(text, why):
    with pytest.raises(MalformedRecord, match="^" + why.replace("[", r"\[").replace("(", r"\(") + "$"):
        Registration.from_json(text)
    assert Registration.read(text) is None


def test_an_empty_slot_a_withdrawn_one_reads_as_none():
    assert Registration.read("") is None and Registration.read(None) is None


def test_a_formed_round_slot_that_holds_no_registration_fails_the_join_naming_it_or_keeps_the_one_read_before():
    texts = [WRITTEN.to_json(), '{"rank": 1}']
    with pytest.raises(JoinError, match=r"rank 1's slot in the store holds no registration \(it has no 'session'\)"):
        read_ranks(texts)
    assert read_ranks(texts, [WRITTEN, FOLLOWER]) == [WRITTEN, FOLLOWER]


@pytest.fixture
def store(port):
    server = Server("127.0.0.1", port)
    client = connect("127.0.0.1", port)
    try:
        yield client
    finally:
        client.close()
        server.stop()


ME = Registration(session="me", rank=0, host="h", pid=1)


@pytest.mark.parametrize("held", ["not json", '{"rank": 0, "host": "x"}', "[0]"])
def test_a_claim_that_is_not_a_registration_is_taken_over_as_a_stale_one(store, held):
    store.set(keys.in_round(0, keys.rank(0)), held)  # written by hand, by anyone who reached the port
    world = rendezvous.join(store, ME, 1, timeout=10)
    assert (world.round, world.ranks[0].session) == (0, "me")
    assert Registration.from_json(store.get(keys.in_round(0, keys.rank(0)))).session == "me"


def test_a_formed_round_whose_slot_holds_no_registration_is_left_for_the_next(store):
    for name, value in ((keys.SIZE, "1"), (keys.READY, "1"), (keys.rank(0), "not json")):
        store.set(keys.in_round(0, name), value)
    world = rendezvous.join(store, ME, 1, timeout=10)
    assert (world.round, world.ranks[0].session) == (1, "me")
