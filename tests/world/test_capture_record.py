"""A rank's record of a %%collective at its end (``t/<n>/out/<i>``) is validated where it is read: what nbdist's own
code publishes reads back as published, anything else reads as no record (a rank that sent no result), never as an
error inside a table, a wait or a watch. Pure, but for the records, which the real code paths make."""

from __future__ import annotations

import json

import pytest
from IPython.core.interactiveshell import InteractiveShell

from nbdist.cell import capture, cells
from nbdist.cell.history import History, summary
from nbdist.cell.outcome_view import final_table
from nbdist.view import trace
from nbdist.view.shrink import fit
from nbdist.world.capture_record import Capture
from nbdist.world.records import MalformedRecord

BODY = ("print('hi')\nimport sys\nprint('careful', file=sys.stderr)\nfrom IPython.display import HTML, display\n"
        "display(HTML('<b>bold</b>'))\n41 + 1\n")


@pytest.fixture(scope="module")
def shell():
    return InteractiveShell.instance()


def published(cap: dict, **more) -> dict:
    """What cells.publish writes for a capture (its _record's fields), as JSON read back."""
    history = History()
    for crc in (123, 123, 7):
        history.add(crc)
    record = {**cap, "rank": 1, "collectives": {"all_reduce": 2, "broadcast": 1},
              "checks": summary({"0": history}, {123: {"op": "all_reduce", "shape": [3]}, 7: {"op": "broadcast"}}),
              "trace": trace.events([("0", 1, "all_reduce", 123, 0.5, 0.75)], {123: {"op": "all_reduce"}}),
              "pg": {"ok": True, "groups": ["0"], "calls": {"0": 3}, "seq": {"0": 3}}, **more}
    return json.loads(fit(record))


def test_every_record_nbdist_publishes_reads_back_as_published(shell):
    shown = published(capture.run_cell(shell, BODY))
    assert [o["kind"] for o in shown["outputs"]] == ["stdout", "stderr", "display"] and shown["result"]
    failed = published(capture.run_cell(shell, "1 / 0\n"), cancelled="rank 0 (h, pid 1) interrupted its cell")
    assert failed["error"]["ename"] == "ZeroDivisionError"
    skipped = {**cells.skipped((0, 1)), "rank": 2, "collectives": {}, "pg": {"ok": False, "why": "no process group"}}
    huge = published({"outputs": [{"kind": "stdout", "text": "x" * 300_000}], "result": None, "error": None,
                      "wall": 2})  # cut to the store's size: still a record
    for record in (shown, failed, skipped, huge, cells.skipped((3,))):  # the last: as the version before may write
        assert Capture.read(json.dumps(record)) == record


GOOD = {"outputs": [{"kind": "stdout", "text": "hi\n"}], "result": None, "error": None, "wall": 0.5, "rank": 1,
        "collectives": {}, "pg": {"ok": True, "groups": ["0"], "calls": {}, "seq": {}}}


@pytest.mark.parametrize(("change", "why"), [
    ({"outputs": "hi"}, "its 'outputs' is \"hi\", not a list"),
    ({"outputs": ["hi"]}, "its 'outputs' holds something other than JSON objects"),
    ({"outputs": [{"kind": "shell", "text": "x"}]}, "its 'outputs'[0]['kind'] is \"shell\", not one of stdout, "
     "stderr, note, display"),
    ({"outputs": [{"kind": "stdout"}]}, "its 'outputs'[0] has no 'text'"),
    ({"outputs": [{"kind": "display", "data": {"text/plain": 1}}]}, "its 'outputs'[0]['data']['text/plain'] is 1, "
     "not text"),
    ({"result": "42"}, "its 'result' is \"42\", not a JSON object"),
    ({"error": {"ename": "ValueError"}}, "its 'error' has no 'evalue'"),
    ({"error": {"ename": "E", "evalue": "v", "interrupted": 1}}, "its 'error'['interrupted'] is 1, not true or false"),
    ({"wall": "1 s"}, "its 'wall' is \"1 s\", not a number"),
    ({"rank": True}, "its 'rank' is true, not a whole number"),
    ({"collectives": {"all_reduce": "2"}}, "its 'collectives'['all_reduce'] is \"2\", not a whole number"),
    ({"pg": {"why": "x"}}, "its 'pg' has no 'ok'"),
    ({"pg": {"ok": True, "seq": {"0": [1]}}}, "its 'pg'['seq']['0'] is [1], not a whole number"),
    ({"checks": {"groups": {"0": {"n": 1, "h": 2, "runs": [[1, "x"]]}}, "sigs": {}}},
     "its 'checks'['groups']['0']['runs'][0][1] is \"x\", not a whole number"),
    ({"trace": [{"group": "0", "seq": 1, "op": "all_reduce", "enter": 1}]}, "its 'trace'[0] has no 'leave'"),
    ({"cancelled": 3}, "its 'cancelled' is 3, not text"),
])
def test_a_record_that_is_not_one_is_refused_with_its_why_and_reads_as_none(change, why):
    text = json.dumps({**GOOD, **change})
    with pytest.raises(MalformedRecord) as caught:
        Capture.from_json(text)
    assert str(caught.value) == why
    assert Capture.read(text) is None


def test_a_rank_whose_record_reads_as_none_is_shown_as_one_that_sent_no_result():
    world = type("W", (), {"world_size": 2, "registrations": lambda self: [{"host": "a"}, {"host": "b"}]})()
    texts = [json.dumps(GOOD), json.dumps({**GOOD, "outputs": [{"kind": "display", "data": "<script>"}]})]
    outcome = cells.Outcome(3, [Capture.read(t) for t in texts])
    table = final_table(world, outcome)
    assert "partial: some ranks sent no result" in table.title and "(no result from this rank)" in repr(table)
    assert Capture.read(None) is None and Capture.read("not json") is None
