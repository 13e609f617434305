"""The where protocol's records (``where/ask/<n>``, ``where/answer/<n>/<rank>``) are validated where read: what nbdist
writes reads back as written; an ask that is not one is not answered, an answer that is not one is no answer, never
an error in the heartbeat's chore or in ``nbdist where``. Real server, real TCP."""

from __future__ import annotations

import json
import time

import pytest

from nbdist.debug import where
from nbdist.world import signing
from nbdist.world.records import MalformedRecord

TOKEN = "where-records"
KEY = signing.key_from(TOKEN)
ROUND = 0
KEYS = where.Keys(ROUND)
THREAD = {"name": "MainThread", "main": True, "frames": [{"file": "<cell>", "line": 3, "name": "<module>"}]}


@pytest.mark.parametrize("request_", [where.Request(3, ROUND), where.Request(4, 2, True, True, "rank 0 (h)", 12.5)])
def test_every_request_nbdist_writes_reads_back_as_written(request_):
    sealed = signing.seal(KEY, where.ASK, request_.record())
    assert where.Request.from_dict(json.loads(json.dumps(sealed))) == request_
    assert where.Request.read(sealed, KEY, request_.n, request_.round) == request_


@pytest.mark.parametrize("answer", [
    where.Answer(1, "h", 42, [THREAD], {"entries": []}, native="py-spy is not installed"),
    where.Answer(0, "h", 41, refused="no key to check requests with"),
])
def test_every_answer_nbdist_writes_reads_back_as_written(answer):
    assert where.Answer.from_dict(json.loads(json.dumps({**answer.record(), "n": 1, "round": ROUND}))) == answer


@pytest.mark.parametrize(("record", "why"), [
    ({"round": 0, "threads": False, "native": False}, "it has no 'n'"),
    ({"n": "1", "round": 0, "threads": False, "native": False}, "its 'n' is \"1\", not a whole number"),
    ({"n": 1, "round": 0, "threads": "yes", "native": False}, "its 'threads' is \"yes\", not true or false"),
    ({"n": 1, "round": 0, "threads": False, "native": False, "by": 3}, "its 'by' is 3, not text"),
    ({"n": 1, "round": 0, "threads": False, "native": False, "t": "now"}, "its 't' is \"now\", not a number"),
])
def test_a_request_that_is_not_one_raises_naming_why_and_does_not_verify_even_sealed(record, why):
    with pytest.raises(MalformedRecord, match="^" + why + "$"):
        where.Request.from_dict(record)
    assert where.Request.read(signing.seal(KEY, where.ASK, record), KEY, 1, 0) is None


@pytest.mark.parametrize(("change", "why"), [
    ({"rank": None}, "its 'rank' is null, not a whole number"),
    ({"pid": "41"}, "its 'pid' is \"41\", not a whole number"),
    ({"threads": "x"}, "its 'threads' is \"x\", not a list"),
    ({"threads": ["x"]}, "its 'threads' holds something other than JSON objects"),
    ({"recorder": [1]}, "its 'recorder' is [1], not a JSON object"),
    ({"native": 1}, "its 'native' is 1, not text"),
])
def test_an_answer_that_is_not_one_raises_naming_why(change, why):
    with pytest.raises(MalformedRecord, match="^" + why.replace("[", r"\[") + "$"):
        where.Answer.from_dict({**where.Answer(1, "h", 42, [THREAD]).record(), **change})


@pytest.mark.parametrize("ask", ["not json", "[1]", "sealed, not a request"])
def test_an_ask_that_is_not_one_is_passed_over_not_answered_and_the_chore_goes_on(client, ask):
    client.add(KEYS.asks, 1)
    text = (json.dumps(signing.seal(KEY, where.ASK, {"n": 1, "round": ROUND, "threads": "yes", "native": False}))
            if ask.startswith("sealed") else ask)
    client.set(KEYS.ask(1), text)
    responder = where.Responder(ROUND, 0, KEY)
    responder.tick(client)
    assert responder.seen == 1
    time.sleep(0.5)  # an answer would be written from its own thread by now
    assert client.get_if(KEYS.answer(1, 0)) is None and client.add(KEYS.answered(1), 0) == 0


def test_an_answer_that_is_not_one_is_no_answer_and_the_others_are_still_read(client):
    sealed = signing.seal(KEY, where.ANSWER, {**where.Answer(2, "h", 42, [THREAD]).record(), "n": 1, "round": ROUND})
    odd = signing.seal(KEY, where.ANSWER, {**where.Answer(3, "h", 43).record(), "threads": "x", "n": 1,
                                           "round": ROUND})
    for rank, text in enumerate(["not json", "[1]", json.dumps(sealed), json.dumps(odd)]):
        client.set(KEYS.answer(1, rank), text)  # the answers of the ask to come (#1), as anyone may write them
    client.add(KEYS.answered(1), 4)
    got = where.ask(client, ROUND, 4, KEY, timeout=1.0)
    assert got.silent == {0: "no answer within 1 s", 1: "no answer within 1 s",
                          3: "its answer is not one nbdist writes (its 'threads' is \"x\", not a list)"}
    assert got.answers[2].threads == [THREAD]
