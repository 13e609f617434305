"""The store's records (pure): each round-trips through its JSON, and any other text is refused with its why."""

from __future__ import annotations

import json

import pytest

from nbdist.world import records, signing
from nbdist.world.records import Failure, MalformedRecord, Message, Refusal

MESSAGE = {"round": 3, "seq": 7, "driver": 0, "session": "s0", "kind": "collective", "source": "x = 1",
           "flags": {"timeout": 300.0, "ranks": [0, 1]}, "gen": 2, "number": 5, "t": 1700000000.5, "sig": "ab"}
REFUSAL = {"rank": 1, "seq": 7, "reason": "its signature does not verify"}
FAILURE = {"rank": 1, "kind": "error", "message": "rank 1 (h, pid 2) raised KeyError: 'x'"}


def test_each_record_round_trips_through_the_json_the_store_has_always_held():
    message = Message.from_json(json.dumps(MESSAGE))
    assert message.as_dict() == MESSAGE and json.loads(message.to_json()) == MESSAGE
    assert Message.from_json(message.to_json()) == message
    assert Refusal.from_json(json.dumps(REFUSAL)) == Refusal(1, 7, "its signature does not verify")
    assert json.loads(Refusal(1, 7, "why").to_json()) == {"rank": 1, "seq": 7, "reason": "why"}
    failure = Failure.from_json(json.dumps(FAILURE))
    assert failure == Failure(1, "error", FAILURE["message"]) and failure.as_dict() == FAILURE
    assert "unstarted" not in failure.to_json()  # as before: only a cell that never started names its body
    unstarted = Failure(0, "interrupted", "rank 0 (h, pid 1) interrupted its cell", "d1g3st")
    assert Failure.from_json(unstarted.to_json()) == unstarted and unstarted.as_dict()["unstarted"] == "d1g3st"
    assert Failure.from_dict({**FAILURE, "session": "s0", "t": 1.0}) == failure  # a stop's extra fields go


def test_the_message_is_stored_and_signed_as_before():
    """The same JSON, field for field and in order, as the dict the driver used to sign and write."""
    key = signing.key_from("secret")
    fields = {k: v for k, v in MESSAGE.items() if k != "sig"}
    before = signing.sign(key, fields)
    message = Message.from_json(json.dumps(fields))
    message = message.signed(signing.sign(key, message.as_dict())["sig"])
    assert message.to_json() == json.dumps(before)
    assert signing.verify(key, message.as_dict(), round_=3, seq=7, driver={"rank": 0, "session": "s0"}) is None


def test_a_whole_number_time_and_a_missing_signature_still_read():
    message = Message.from_json(json.dumps({**{k: v for k, v in MESSAGE.items() if k != "sig"}, "t": 5}))
    assert message.t == 5.0 and message.sig == ""  # unsigned: verify refuses it, as before, for its signature


MALFORMED_MESSAGES = [
    ("import os", "not a JSON object"),
    ("", "not a JSON object"),
    ("[1, 2]", "not a JSON object"),
    ('"text"', "not a JSON object"),
    ("null", "not a JSON object"),
    (json.dumps({k: v for k, v in MESSAGE.items() if k != "seq"}), "it has no 'seq'"),
    (json.dumps({**MESSAGE, "seq": "7"}), "its 'seq' is \"7\", not a whole number"),
    (json.dumps({**MESSAGE, "seq": 7.0}), "its 'seq' is 7.0, not a whole number"),
    (json.dumps({**MESSAGE, "seq": True}), "its 'seq' is true, not a whole number"),
    (json.dumps({**MESSAGE, "driver": -1}), "its 'driver' is -1, below 0"),
    (json.dumps({**MESSAGE, "number": -5}), "its 'number' is -5, below 0"),
    (json.dumps({**MESSAGE, "round": None}), "its 'round' is null, not a whole number"),
    (json.dumps({**MESSAGE, "gen": False}), "its 'gen' is false, not a whole number"),
    (json.dumps({**MESSAGE, "session": 0}), "its 'session' is 0, not text"),
    (json.dumps({**MESSAGE, "source": ["x = 1"]}), "its 'source' is [\"x = 1\"], not text"),
    (json.dumps({**MESSAGE, "flags": []}), "its 'flags' is [], not a JSON object"),
    (json.dumps({**MESSAGE, "kind": "shell"}), "its 'kind' is \"shell\", not one of collective, barrier, release"),
    (json.dumps({**MESSAGE, "kind": 1}), "its 'kind' is 1, not text"),
    (json.dumps({**MESSAGE, "t": "now"}), "its 't' is \"now\", not a time"),
    (json.dumps({**MESSAGE, "t": -1}), "its 't' is -1, not a time"),
    (json.dumps({**MESSAGE, "t": True}), "its 't' is true, not a time"),
    (json.dumps({**MESSAGE, "sig": 12}), "its 'sig' is 12, not text"),
    (json.dumps({**MESSAGE, "source": "x" * 100, "seq": "y" * 100}), "its 'seq' is \"yyyy"),
]


@pytest.mark.parametrize("text,why", MALFORMED_MESSAGES)
def test_a_malformed_message_is_refused_with_its_why(text, why):
    with pytest.raises(MalformedRecord) as caught:
        Message.from_json(text)
    assert str(caught.value).startswith(why), str(caught.value)
    assert len(str(caught.value)) < 120  # what it quotes of the text is short
    value = caught.value.value  # what a JSON object claims, for the refusal to name
    assert value is None if why == "not a JSON object" else isinstance(value, dict)


@pytest.mark.parametrize("text,why", [
    ("{}", "it has no 'rank'"),
    ("garbage", "not a JSON object"),
    (json.dumps({**REFUSAL, "rank": "1"}), "its 'rank' is \"1\", not a whole number"),
    (json.dumps({**REFUSAL, "rank": -1}), "its 'rank' is -1, below 0"),
    (json.dumps({**REFUSAL, "seq": True}), "its 'seq' is true, not a whole number"),
    (json.dumps({**REFUSAL, "reason": None}), "its 'reason' is null, not text"),
])
def test_a_malformed_refusal_is_refused_with_its_why(text, why):
    with pytest.raises(MalformedRecord, match=f"^{why}$".replace("(", r"\(")):
        Refusal.from_json(text)


@pytest.mark.parametrize("text,why", [
    ("x", "not a JSON object"),
    ("{}", "it has no 'rank'"),
    (json.dumps({**FAILURE, "rank": -2}), "its 'rank' is -2, below -1"),
    (json.dumps({**FAILURE, "rank": False}), "its 'rank' is false, not a whole number"),
    (json.dumps({**FAILURE, "kind": "exploded"}), "its 'kind' is \"exploded\", not one of error, interrupted, "),
    (json.dumps({k: v for k, v in FAILURE.items() if k != "message"}), "it has no 'message'"),
    (json.dumps({**FAILURE, "message": {"text": "x"}}), "its 'message' is {\"text\": \"x\"}, not text"),
    (json.dumps({**FAILURE, "unstarted": None}), "its 'unstarted' is null, not text"),
])
def test_a_malformed_failure_is_refused_with_its_why_and_read_as_none(text, why):
    with pytest.raises(MalformedRecord) as caught:
        Failure.from_json(text)
    assert str(caught.value).startswith(why), str(caught.value)
    assert Failure.read(text) is None


def test_every_kind_of_failure_nbdist_publishes_reads_and_one_of_the_world_has_no_rank():
    for kind in records.FAILURE_KINDS:
        assert Failure.from_json(json.dumps({**FAILURE, "kind": kind})).kind == kind
    assert Failure.from_json(json.dumps({**FAILURE, "rank": records.WORLD, "kind": "lost"})).rank == -1
    assert Failure.read(None) is None


def test_an_arrival_is_stored_as_the_meeting_record_always_was():
    """A cell's fields first, then its kind and label (what kernels of the version before write and read)."""
    start = records.CellStart("ab12", "x = 1\n", {"ok": True, "gen": 0}, {"no_check": False, "ranks": None})
    cell = records.Arrival("cell", "%%collective #3 (start)", start)
    assert cell.to_json() == json.dumps({"hash": "ab12", "code": "x = 1\n", "pg": {"ok": True, "gen": 0},
                                         "flags": {"no_check": False, "ranks": None}, "kind": "cell",
                                         "label": "%%collective #3 (start)"})
    barrier = records.Arrival("barrier", "%dist_barrier #4")
    assert barrier.to_json() == json.dumps({"kind": "barrier", "label": "%dist_barrier #4"})
    for arrival in (cell, barrier, records.Arrival("rebuild", "rebuilding the process group")):
        assert records.Arrival.from_json(arrival.to_json()) == arrival


@pytest.mark.parametrize(("record", "text", "why"), [
    (records.Arrival, '{"kind": "barrier"}', "it has no 'label'"),
    (records.Arrival, '{"kind": "cell!", "label": "x"}', "its 'kind' is \"cell!\", not one of cell, barrier, rebuild"),
    (records.Arrival, '{"kind": "cell", "label": "x", "hash": "h", "code": "c", "pg": [], "flags": {}}',
     "its 'pg' is [], not a JSON object"),
    (records.Arrival, '{"kind": "cell", "label": "x", "code": "c", "pg": {}, "flags": {}}', "it has no 'hash'"),
    (records.Arrival, "[1]", "not a JSON object"),
    (records.Note, '{"t": 1}', "it has no 'what'"),
    (records.Note, '{"what": 3, "t": 1}', "its 'what' is 3, not text"),
    (records.Note, '{"what": "x", "t": "soon"}', "its 't' is \"soon\", not a time"),
    (records.Note, '{"what": "x", "t": 1, "barrier": 4}', "its 'barrier' is 4, not text"),
    (records.Note, '{"what": "x", "t": 1, "cell": true}', "its 'cell' is true, not a whole number"),
    (records.Note, '"joined"', "not a JSON object"),
    (records.StopAll, '{"t": 1}', "it has no 'message'"),
    (records.StopAll, '{"message": "x", "session": 0, "t": 1}', "its 'session' is 0, not text"),
    (records.StopAll, '{"message": "x", "t": null}', "its 't' is null, not a time"),
    (records.Busy, '{"t": 1}', "it has no 'busy'"),
    (records.Busy, '{"busy": 1, "t": 1}', "its 'busy' is 1, not true or false"),
    (records.Busy, '{"busy": true, "t": "now"}', "its 't' is \"now\", not a time"),
    (records.LivePart, '{"outputs": []}', "it has no 'state'"),
    (records.LivePart, '{"state": "done", "outputs": []}',
     "its 'state' is \"done\", not one of running, finished, failed"),
    (records.LivePart, '{"state": "running", "outputs": "x"}', "its 'outputs' is \"x\", not a list"),
    (records.LivePart, '{"state": "running", "outputs": [1]}', "its 'outputs' holds something other than JSON objects"),
    (records.LivePart, '{"state": "failed", "outputs": [], "wall": "1"}', "its 'wall' is \"1\", not a number"),
])
def test_a_malformed_arrival_note_or_live_part_is_refused_with_its_why(record, text, why):
    with pytest.raises(MalformedRecord) as caught:
        record.from_json(text)
    assert str(caught.value) == why


def test_a_note_that_is_not_one_reads_as_none():
    """Anyone who reaches the port can write a note: a wait's message then says no activity was recorded."""
    assert records.Note.read('{"what": 3, "t": 1}') is None and records.Note.read(None) is None


def test_a_note_is_stored_as_the_note_always_was_its_unset_fields_left_out():
    note = records.Note("waiting at %%collective #6 (start)", 12.5, barrier="t/6/in", then="passed it", turn=6)
    assert note.to_json() == json.dumps({"what": "waiting at %%collective #6 (start)", "t": 12.5,
                                         "barrier": "t/6/in", "then": "passed it", "turn": 6})
    watched = records.Note("inside collective #2 (all_reduce) of %%collective #5", 3.0, body="t/5",
                           collective="collective #2 (all_reduce)")
    for each in (note, watched, records.Note("joined", 1), records.Note("finished %%collective #2", 2.0, cell=2)):
        assert records.Note.from_json(each.to_json()) == each
    # What the version before wrote, in its order, reads the same.
    assert records.Note.from_json('{"what": "running %%collective #3", "t": 7, "cell": 3, "body": "t/3"}') == \
        records.Note("running %%collective #3", 7.0, cell=3, body="t/3")


def test_a_stop_request_is_stored_as_it_always_was():
    stop = records.StopAll("stopped by rank 0 with %dist_stop", "s0", 12.5)
    assert stop.to_json() == json.dumps({"message": stop.message, "session": "s0", "t": 12.5})
    assert records.StopAll.from_json(stop.to_json()) == stop
    assert records.StopAll.from_json('{"message": "m", "t": 3}') == records.StopAll("m", "", 3.0)


def test_a_busy_record_is_stored_as_it_always_was_and_one_that_is_not_reads_as_none():
    assert records.Busy(True, 12.5).to_json() == json.dumps({"busy": True, "t": 12.5})
    assert records.Busy.read('{"busy": false, "t": 3}') == records.Busy(False, 3.0)
    assert records.Busy.read("[true]") is None and records.Busy.read(None) is None


def test_a_live_part_is_stored_as_it_always_was():
    running = records.LivePart("running", [{"kind": "stdout", "text": "x\n"}], where="at cell line 3")
    assert running.as_dict() == {"state": "running", "outputs": [{"kind": "stdout", "text": "x\n"}],
                                 "where": "at cell line 3"}
    failed = records.LivePart("failed", [], wall=1.5, why="ZeroDivisionError")
    for part in (running, failed, records.LivePart("finished", [])):
        assert records.LivePart.from_json(json.dumps(part.as_dict())) == part
    assert records.LivePart.from_json('{"state": "finished", "outputs": [], "wall": 2}').wall == 2.0


def test_a_rounds_error_record_gives_its_message_and_one_that_is_not_nbdists_still_fails_the_join_naming_it():
    assert records.world_error(json.dumps({"message": "world sizes disagree: ..."})) == "world sizes disagree: ..."
    for text in ("oops", '{"message": 3}', "[]"):
        assert records.world_error(text).startswith("this round of the world is marked failed: ")
