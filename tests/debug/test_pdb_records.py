"""%dist_pdb's records (``pdb/ask/<n>``; the relay's chunks ``…/out/<j>`` and lines ``…/in/<j>``) are validated where
read: what nbdist writes reads back as written; one that is not one, even sealed with the world's key, opens no
debugger, is shown to no one and is typed into no debugger (refused, logged once), never an error in the heartbeat's
chore or a wrong line. Real server, real TCP."""

from __future__ import annotations

import json
import time

import pytest

from nbdist.debug import postmortem, relay
from nbdist.world import keys, signing
from nbdist.world.records import MalformedRecord

TOKEN = "pdb-records"
KEY = signing.key_from(TOKEN)
ROUND = 2
ASK = {"n": 1, "round": ROUND, "rank": 1, "asker": 0, "by": "rank 0 (h)", "t": 12.5}
CHUNK = {"n": 1, "round": ROUND, "rank": 1, "j": 0, "text": "> cell(3)\n", "prompt": "ipdb> ", "end": None}
LINE = {"n": 1, "round": ROUND, "rank": 1, "j": 0, "line": "p x"}


def escaped(why: str) -> str:
    return "^" + why.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)") + "$"


# --- pdb/ask/<n> ---------------------------------------------------------------------------------

@pytest.mark.parametrize("request_", [postmortem.Request(1, ROUND, 1), postmortem.Request(3, 0, 2, 0, "rank 0 (h)")])
def test_every_request_nbdist_writes_reads_back_as_written(request_):
    sealed = json.loads(json.dumps(signing.seal(KEY, postmortem.ASK, request_.record())))
    assert postmortem.Request.from_dict(sealed) == request_
    assert postmortem.Request.read(sealed, KEY, request_.n, request_.round) == request_


@pytest.mark.parametrize(("change", "why"), [
    ({"rank": None}, "its 'rank' is null, not a whole number"),
    ({"rank": "1"}, "its 'rank' is \"1\", not a whole number"),
    ({"rank": True}, "its 'rank' is true, not a whole number"),
    ({"rank": -1}, "its 'rank' is -1, below 0"),
    ({"asker": "x"}, "its 'asker' is \"x\", not a whole number"),
    ({"asker": None}, "its 'asker' is null, not a whole number"),
    ({"asker": -2}, "its 'asker' is -2, below -1"),
    ({"by": 5}, "its 'by' is 5, not text"),
    ({"t": "now"}, "its 't' is \"now\", not a number"),
    ({"round": [2]}, "its 'round' is [2], not a whole number"),
])
def test_a_request_that_is_not_one_raises_naming_why_and_does_not_verify_even_sealed(change, why):
    record = {**ASK, **change}
    with pytest.raises(MalformedRecord, match=escaped(why)):
        postmortem.Request.from_dict(record)
    assert postmortem.Request.read(signing.seal(KEY, postmortem.ASK, record), KEY, 1, ROUND) is None


def test_a_request_without_asker_or_by_reads_with_their_defaults():
    assert postmortem.Request.from_dict({"n": 1, "round": ROUND, "rank": 1}) == postmortem.Request(1, ROUND, 1)


@pytest.mark.parametrize("change", [{"asker": "x"}, {"asker": None}, {"rank": True}, {"by": ["rank 0"]}])
def test_a_sealed_request_that_is_not_one_opens_no_debugger_and_the_chore_goes_on(client, caplog, change):
    kept = postmortem.Kept()
    try:
        1 / 0  # noqa: B018 (a failed body for the debugger to open on, were the request taken)
    except ZeroDivisionError as exc:
        kept.body_ended(exc, exc.__traceback__)
    responder = postmortem.Responder(ROUND, 1, "rank 1", KEY, kept)
    n = client.add(keys.in_round(ROUND, keys.PDB_ASKS), 1)
    client.set_json(keys.in_round(ROUND, keys.pdb_ask(n)), signing.seal(KEY, postmortem.ASK, {**ASK, "n": n, **change}))
    with caplog.at_level("WARNING"):
        responder.tick(client)  # the heartbeat's chore: it must not raise
    assert responder.seen == n and responder.thread is None
    assert f"a %dist_pdb request (#{n}) did not verify" in caplog.text
    time.sleep(0.3)
    assert client.get_if(keys.in_round(ROUND, keys.pdb_out(n, 0))) is None  # nothing answered


# --- the relay: pdb/<k>/out/<j>, pdb/<k>/in/<j> ---------------------------------------------------

@pytest.mark.parametrize("chunk", [relay.Chunk("> cell(3)\n", "ipdb> "), relay.Chunk("", end="the debugger ended")])
def test_every_chunk_nbdist_writes_reads_back_as_written(client, chunk):
    debugged, asker = (relay.Channel(client, KEY, ROUND, 1, rank=1) for _ in range(2))
    debugged.publish(chunk.text, chunk.prompt, chunk.end)
    assert asker.poll() == chunk
    assert relay.Chunk.from_dict(chunk.record()) == chunk


@pytest.mark.parametrize(("change", "why"), [
    ({"text": 5}, "its 'text' is 5, not text"),
    ({"text": None}, "its 'text' is null, not text"),
    ({"prompt": ["ipdb> "]}, "its 'prompt' is [\"ipdb> \"], not text"),
    ({"end": 5}, "its 'end' is 5, not text"),
    ({"end": False}, "its 'end' is false, not text"),
    ({"end": {"why": "x"}}, "its 'end' is {\"why\": \"x\"}, not text"),
])
def test_a_chunk_that_is_not_one_raises_naming_why(change, why):
    with pytest.raises(MalformedRecord, match=escaped(why)):
        relay.Chunk.from_dict({**CHUNK, **change})


def test_a_chunk_without_text_is_not_one():
    with pytest.raises(MalformedRecord, match="^it has no 'text'$"):
        relay.Chunk.from_dict({k: v for k, v in CHUNK.items() if k != "text"})


@pytest.mark.parametrize("change", [{"text": 5}, {"end": 5}, {"end": 0}, {"prompt": None}])
def test_a_sealed_chunk_that_is_not_one_is_refused_once_and_not_shown(client, caplog, change):
    asker = relay.Channel(client, KEY, ROUND, 1, rank=1)
    key = keys.in_round(ROUND, keys.pdb_out(1, 0))
    client.set_json(key, signing.seal(KEY, relay.OUT, {**CHUNK, **change}))
    with caplog.at_level("WARNING"):
        assert asker.poll() is None
        assert asker.poll() is None
    assert asker.refused == {0}
    assert caplog.text.count("debugger output #0 of pdb request #1 is not one nbdist writes") == 1, caplog.text
    chunk = asker.receive(0.3, lambda: None)  # waited past, as a chunk that did not verify
    assert chunk.text == "" and chunk.end is not None and "no answer from rank 1" in chunk.end
    relay.Channel(client, KEY, ROUND, 1, rank=1).publish("p x\n41\n", "ipdb> ")  # the real one overwrites it
    assert asker.poll() == relay.Chunk("p x\n41\n", "ipdb> ")


@pytest.mark.parametrize(("change", "why"), [
    ({"line": 5}, "its 'line' is 5, not text"),
    ({"line": ["p x"]}, "its 'line' is [\"p x\"], not text"),
    ({"line": True}, "its 'line' is true, not text"),
])
def test_a_line_that_is_not_one_raises_naming_why(change, why):
    with pytest.raises(MalformedRecord, match=escaped(why)):
        relay.Line.from_dict({**LINE, **change})


def test_a_line_record_without_line_is_not_one_and_null_is_end_of_input():
    with pytest.raises(MalformedRecord, match="^it has no 'line'$"):
        relay.Line.from_dict({k: v for k, v in LINE.items() if k != "line"})
    assert relay.Line.from_dict({**LINE, "line": None}) == relay.Line(None)


@pytest.mark.parametrize("change", [{"line": 5}, {"line": ["p x"]}, {"line": True}])
def test_a_sealed_line_that_is_not_one_is_refused_once_and_typed_into_no_debugger(client, caplog, change):
    debugged = relay.Channel(client, KEY, ROUND, 1, rank=1)
    client.set_json(keys.in_round(ROUND, keys.pdb_in(1, 0)), signing.seal(KEY, relay.IN, {**LINE, **change}))
    with caplog.at_level("WARNING"):
        assert debugged.line() == (False, None)
        assert debugged.line() == (False, None)
    assert debugged.refused == {0}
    assert caplog.text.count("debugger input line #0 of pdb request #1 is not one nbdist writes") == 1, caplog.text
    relay.Channel(client, KEY, ROUND, 1, rank=1).send("p x")  # the asker's own line overwrites it
    assert debugged.wait_line(5) == "p x"
