"""StoreClient counts this process's store traffic (nbdist.world.store.COUNTS), on a real store."""

from __future__ import annotations

from nbdist.world import store
from nbdist.world.store import COUNTS, PREFIX, StoreClient, StoreCounts

TOKEN = "counts-test-token"


def moved(before: dict) -> dict:
    return StoreCounts.delta(before, COUNTS.snapshot())


def test_set_get_add_move_the_counts_by_their_keys_and_values(client: StoreClient) -> None:
    key, value = "counts/a", '{"x": 1}'
    full = len(PREFIX) + len(key)
    before = COUNTS.snapshot()
    client.set(key, value)
    assert client.get(key) == value
    assert client.add("counts/n", 5) == 5
    assert client.add("counts/n", 2) == 7
    d = moved(before)
    assert d["ops"] == 4
    assert d["kinds"]["set"] == [1, full + len(value), 0]
    assert d["kinds"]["get"] == [1, full, len(value)]
    n = len(PREFIX) + len("counts/n")
    assert d["kinds"]["add"] == [2, 2 * (n + 8), 2 * 8]
    assert set(d["kinds"]) == {"set", "get", "add"}
    assert d["sent"] == sum(k[1] for k in d["kinds"].values())
    assert d["received"] == sum(k[2] for k in d["kinds"].values()) == len(value) + 16
    assert d["get_if"] == 0


def test_get_if_multi_get_check_delete_append_and_wait_are_counted(client: StoreClient) -> None:
    client.set("c/1", "ab")
    client.set("c/2", "cde")
    before = COUNTS.snapshot()
    assert client.get_if("c/1") == "ab"
    assert client.get_if("c/missing") is None
    assert client.multi_get(["c/1", "c/2"]) == ["ab", "cde"]
    assert client.check(["c/1"]) is True
    client.append("c/1", "x")
    client.delete("c/2")
    client.wait(["c/1"], 5.0)
    d = moved(before)
    assert d["ops"] == 7  # two get_if, multi_get, check, append, delete, wait
    assert d["get_if"] == 2
    assert d["kinds"]["compare_set"][0] == 2
    assert d["kinds"]["compare_set"][2] == len("ab") + len(store._ABSENT)
    assert d["kinds"]["multi_get"] == [1, 2 * len(PREFIX + "c/1"), 5]
    assert d["kinds"]["check"] == [1, len(PREFIX + "c/1"), 1]
    assert d["kinds"]["append"] == [1, len(PREFIX + "c/1") + 1, 0]
    assert d["kinds"]["delete_key"][:1] == [1]
    assert d["kinds"]["wait"] == [1, len(PREFIX + "c/1"), 0]


def test_delta_leaves_out_kinds_that_did_not_move() -> None:
    before = {"ops": 1, "sent": 2, "received": 3, "get_if": 0, "kinds": {"set": [1, 2, 0], "get": [0, 0, 3]}}
    after = {"ops": 2, "sent": 4, "received": 3, "get_if": 0, "kinds": {"set": [2, 4, 0], "get": [0, 0, 3]}}
    assert StoreCounts.delta(before, after) == {"ops": 1, "sent": 2, "received": 0, "get_if": 0,
                                                "kinds": {"set": [1, 2, 0]}}
