"""Schedule fuzzing at the store's choke point (NBDIST_STORE_FUZZ): its parsing, its seeded decisions, and a fuzzed
client that still does real work and still names a server that went away. Real server, real TCP; decisions are
counted, never timed."""

from __future__ import annotations

import threading

import pytest

from nbdist.config import FUZZ_VARIABLE, StoreFuzz, parse_store_fuzz, store_fuzz
from nbdist.errors import ConfigError, StoreConnectionError
from nbdist.world.store import Fuzzer, Server, connect


@pytest.fixture
def server(port):
    server = Server("127.0.0.1", port)
    yield server
    server.stop()


def fuzzed(monkeypatch, server, spec: str):
    """A client made while NBDIST_STORE_FUZZ=spec (the variable is read when a client is made)."""
    monkeypatch.setenv(FUZZ_VARIABLE, spec)
    return connect("127.0.0.1", server.port)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", StoreFuzz(7, 0.35, 50.0)),
        ("7:0.35:50", StoreFuzz(7, 0.35, 50.0)),
        (" 3:1:0 ", StoreFuzz(3, 1.0, 0.0)),
        ("3:0:12.5", StoreFuzz(3, 0.0, 12.5)),
        ("", None),
    ],
)
def test_the_variable_is_a_seed_or_a_seed_a_probability_and_a_longest_delay(value, expected):
    assert store_fuzz({FUZZ_VARIABLE: value}) == expected
    assert expected is None or store_fuzz({FUZZ_VARIABLE: expected.spec}) == expected


def test_unset_means_off():
    assert store_fuzz({}) is None


@pytest.mark.parametrize(
    "value", ["x", "1.5", "7:0.5", "7:0.5:5:1", "7:1.5:5", "7:-0.1:5", "7:0.5:-1", "7:nan:5", "7:0.5:inf", "7::5"]
)
def test_a_malformed_value_names_the_variable_and_the_accepted_form(value):
    with pytest.raises(ConfigError) as caught:
        store_fuzz({FUZZ_VARIABLE: value})
    message = str(caught.value)
    assert message.startswith(f"{FUZZ_VARIABLE} must be SEED or SEED:PROBABILITY:MAX_MS (e.g. 7 or 7:0.35:50")
    assert repr(value.strip()) in message and "\n" not in message
    with pytest.raises(ConfigError, match="^--fuzz must be SEED"):
        parse_store_fuzz(value, "--fuzz")


def test_a_bad_variable_stops_a_client_from_being_made(monkeypatch, server):
    with pytest.raises(ConfigError, match=FUZZ_VARIABLE):
        fuzzed(monkeypatch, server, "seven")


def test_off_a_client_has_no_fuzzer_and_reads_the_variable_only_when_it_is_made(monkeypatch, server):
    monkeypatch.delenv(FUZZ_VARIABLE, raising=False)
    client = connect("127.0.0.1", server.port)
    try:
        plain = client.clone()
        assert client.fuzzer is None and plain.fuzzer is None
        monkeypatch.setenv(FUZZ_VARIABLE, "1:1:1")
        client.set("a", "1")
        assert client.fuzzer is None  # set later: this client's calls stay as they were
        later = client.clone()
        assert later.fuzzer is not None  # a client made now reads it
        for c in (plain, later):
            c.close()
    finally:
        client.close()


def test_with_probability_one_every_chance_is_taken_before_and_after_each_call(monkeypatch, server):
    client = fuzzed(monkeypatch, server, "5:1:1")
    try:
        before = client.fuzzer.chances
        assert before == client.fuzzer.delays > 0  # connect's own check of the server's marker went through it
        client.set("a", "1")
        client.get("a")
        client.add("n", 1)
        client.wait(["a"], 5.0)
        assert client.fuzzer.chances == before + 8  # four calls, a chance before and after each
        assert client.fuzzer.delays == client.fuzzer.chances
    finally:
        client.close()


def test_with_probability_zero_no_chance_is_taken(monkeypatch, server):
    client = fuzzed(monkeypatch, server, "5:0:50")
    try:
        for i in range(20):
            client.set(f"k{i}", "v")
        client.wait(["k0"], 5.0)
        assert client.fuzzer.chances >= 42 and client.fuzzer.delays == 0
    finally:
        client.close()


def test_the_same_seed_and_ordinal_draw_the_same_decisions_and_another_ordinal_others():
    fuzz = StoreFuzz(11, 0.35, 50.0)
    first, again, other = Fuzzer(fuzz, 3), Fuzzer(fuzz, 3), Fuzzer(fuzz, 4)
    drawn = [first.draw() for _ in range(200)]
    assert drawn == [again.draw() for _ in range(200)]
    assert drawn != [other.draw() for _ in range(200)]
    assert 0 < first.delays < 200 and first.delays == sum(1 for d in drawn if d > 0)
    assert all(0.0 <= d <= 0.050 for d in drawn)
    assert drawn != [Fuzzer(StoreFuzz(12, 0.35, 50.0), 3).draw() for _ in range(200)]


def test_each_client_and_each_clone_has_its_own_ordinal(monkeypatch, server):
    a, b = fuzzed(monkeypatch, server, "9:0.5:1"), fuzzed(monkeypatch, server, "9:0.5:1")
    try:
        clone = a.clone()
        ordinals = [c.fuzzer.ordinal for c in (a, b, clone)]
        assert len(set(ordinals)) == 3 and ordinals == sorted(ordinals)
        assert clone.fuzzer.fuzz == a.fuzzer.fuzz == StoreFuzz(9, 0.5, 1.0)
        clone.close()
    finally:
        a.close()
        b.close()


def test_a_fuzzed_client_still_sets_gets_compares_and_waits(monkeypatch, server):
    a, b = fuzzed(monkeypatch, server, "21:1:5"), fuzzed(monkeypatch, server, "22:1:5")
    try:
        a.set_json("x", {"v": 1})
        assert b.get_json("x") == {"v": 1}
        assert b.compare_set("c", "", "first") == "first"
        assert a.compare_set("c", "wrong", "second") == "first"
        assert a.compare_set("c", "first", "second") == "second"
        assert a.get_if("missing") is None and a.add("n", 2) == 2 and b.add("n", 3) == 5
        late = threading.Timer(0.2, lambda: b.set("late", "here"))
        late.start()
        a.wait(["late"], 10.0)
        late.join()
        assert a.get("late") == "here" and a.check(["x", "late"]) and a.multi_get(["x", "late"]) == ['{"v": 1}', "here"]
    finally:
        a.close()
        b.close()


def test_a_fuzzed_client_still_names_a_server_that_went_away_with_no_delay_after_the_error(monkeypatch, port):
    import torch.distributed as dist

    server = Server("127.0.0.1", port)
    client = fuzzed(monkeypatch, server, "3:1:1")
    try:
        client.set("a", "1")
        server.stop()
        for _ in range(50):  # the first call after the stop may still be answered from the socket's buffers
            seen = client.fuzzer.chances
            try:
                client.get("a")
            except StoreConnectionError as exc:
                error = exc
                break
        else:
            pytest.fail("the store kept answering after its server stopped")
        assert f"the rendezvous server at 127.0.0.1:{port} stopped answering (get)" in str(error)
        assert isinstance(error.__cause__, (dist.DistNetworkError, dist.DistStoreError))
        assert client.fuzzer.chances == seen + 1  # the chance before the call; none after its error
    finally:
        client.close()
        server.stop()


def test_a_process_says_once_that_its_store_calls_are_fuzzed(monkeypatch, server, caplog):
    import itertools

    from nbdist.world import store

    monkeypatch.setattr(store, "_ORDINALS", itertools.count())  # as in a fresh process
    with caplog.at_level("INFO", logger="nbdist.world.store"):
        clients = [fuzzed(monkeypatch, server, "4:0.5:1") for _ in range(2)]
        clients.append(clients[0].clone())
    try:
        said = [r for r in caplog.records if "store fuzzing on" in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "INFO" and f"{FUZZ_VARIABLE}=4:0.5:1" in said[0].getMessage()
        assert [c.fuzzer.ordinal for c in clients] == [0, 1, 2]
    finally:
        for c in clients:
            c.close()
