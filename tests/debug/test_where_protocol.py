"""%dist_where's protocol on a real TCPStore: signed requests answered from real heartbeat threads (no kernels)."""

from __future__ import annotations

import json

from nbdist.debug import where
from nbdist.world import signing
from nbdist.world.heartbeat import Heartbeat
from nbdist.world.store import StoreClient

TOKEN = "where-test-token"
KEY = signing.key_from(TOKEN)
ROUND = 3


def ranks_answering(client: StoreClient, keys: list[bytes | None]) -> list[Heartbeat]:
    """One real heartbeat per rank (this process stands for each), each answering with its own key."""
    beats = []
    for rank, key in enumerate(keys):
        responder = where.Responder(ROUND, rank, key, "no key here", seen=client.add(where.Keys(ROUND).asks, 0))
        beat = Heartbeat(client.clone(), f"s{rank}", rank)
        beat.add_chore(responder.tick)
        beats.append(beat)
    return beats


def test_every_rank_answers_from_its_heartbeat_thread_with_its_stacks_and_recorder(client):
    beats = ranks_answering(client, [KEY, KEY])
    try:
        got = where.ask(client, ROUND, 2, KEY, threads=True, timeout=30)
    finally:
        for b in beats:
            b.stop()
    assert sorted(got.answers) == [0, 1] and got.silent == {}
    for rank, answer in got.answers.items():
        assert answer.rank == rank and answer.threads[0]["main"]
        assert answer.recorder == {"off": "no process group on this rank"}
        # the answering thread leaves itself out; this test's main thread waits in ask()
        assert "nbdist-where" not in [t["name"] for t in answer.threads]
        assert any(f[2] == "ask" for f in answer.threads[0]["frames"]), answer.threads[0]


def test_a_request_not_signed_with_the_worlds_key_is_not_answered(client):
    responder = where.Responder(ROUND, 0, KEY, seen=0)
    keys = where.Keys(ROUND)
    n = client.add(keys.asks, 1)
    forged = signing.seal(signing.key_from("another world"), where.ASK, where.Request(n, ROUND).record())
    client.set_json(keys.ask(n), forged)
    responder.tick(client)
    assert responder.seen == n and client.get_if(keys.answer(n, 0)) is None
    n = client.add(keys.asks, 1)  # an earlier genuine request, written again under a new number: a replay
    client.set_json(keys.ask(n), signing.seal(KEY, where.ASK, where.Request(n - 1, ROUND).record()))
    responder.tick(client)
    assert responder.seen == n and client.get_if(keys.answer(n, 0)) is None


def test_a_forged_answer_and_a_silent_rank_are_named_as_not_heard(client):
    keys = where.Keys(ROUND)
    n = client.add(keys.asks, 0) + 1  # the number the next request takes
    forged = where.Answer(1, "elsewhere", 1).record()
    client.set_json(keys.answer(n, 1), {**signing.seal(b"wrong", where.ANSWER, forged), "n": n, "round": ROUND})
    beats = ranks_answering(client, [KEY])  # rank 0 answers, rank 1's answer is forged, rank 2 is silent
    try:
        got = where.ask(client, ROUND, 3, KEY, timeout=2)
    finally:
        for b in beats:
            b.stop()
    assert sorted(got.answers) == [0]
    assert got.silent == {1: "its answer did not verify (not signed with this world's key)",
                          2: "no answer within 2 s"}


def test_a_rank_without_the_worlds_key_says_so_instead_of_answering(client):
    beats = ranks_answering(client, [None])
    try:
        got = where.ask(client, ROUND, 1, KEY, timeout=30)
    finally:
        beats[0].stop()
    assert got.answers == {} and got.silent == {0: "it cannot check requests: no key here"}


class Counting:
    """A real store client that counts the operations made through it."""

    def __init__(self, client: StoreClient) -> None:
        self.client, self.calls = client, []

    def __getattr__(self, name: str):
        self.calls.append(name)
        return getattr(self.client, name)


def test_with_no_request_a_beat_costs_one_store_operation(client):
    responder = where.Responder(ROUND, 0, KEY, seen=client.add(where.Keys(ROUND).asks, 0))
    counting = Counting(client)
    for _ in range(5):
        responder.tick(counting)  # type: ignore[arg-type]
    assert counting.calls == ["add"] * 5


def test_an_answer_too_large_for_the_store_is_cut_to_the_innermost_frames_and_latest_entries():
    frame = ["torch/x.py", 1, "f" * 200, "py", ""]
    answer = where.Answer(0, threads=[{"name": "MainThread", "main": True, "skipped": 0, "frames": [frame] * 500},
                                      {"name": "other", "main": False, "skipped": 0, "frames": [frame] * 500}],
                          recorder={"entries": [{"n": i, "pad": "x" * 200} for i in range(400)]})
    cut = where.fit(answer, limit=20_000)
    assert len(json.dumps(cut.record())) <= 20_000
    assert [t["name"] for t in cut.threads] == ["MainThread"]
    assert len(cut.threads[0]["frames"]) == where.CUT_FRAMES and cut.threads[0]["skipped"] == 500 - where.CUT_FRAMES
    assert cut.recorder["entries"][-1]["n"] == 399  # the latest kept
