"""A rank's record of a %%collective at its end (``t/<n>/out/<i>``) is validated where it is read: what nbdist's own
code publishes reads back as published, anything else reads as no record (a rank that sent no result), never as an
error inside a table, a wait or a watch. Its one codec (``Capture.as_dict``, ``Capture.from_dict``) writes the JSON
the store has always held, text for text, so kernels of this version and the one before read each other's records.
Pure, but for the records, which the real code paths make."""

from __future__ import annotations

import json

import pytest
from IPython.core.interactiveshell import InteractiveShell

from nbdist.cell import capture, cells
from nbdist.cell.history import History, summary
from nbdist.cell.outcome_view import final_table
from nbdist.view import trace
from nbdist.view.shrink import fit
from nbdist.world.capture_record import Capture, Raised
from nbdist.world.records import MalformedRecord

BODY = ("print('hi')\nimport sys\nprint('careful', file=sys.stderr)\nfrom IPython.display import HTML, display\n"
        "display(HTML('<b>bold</b>'))\n41 + 1\n")


@pytest.fixture(scope="module")
def shell():
    return InteractiveShell.instance()


def published(cap: Capture | dict, **more) -> dict:
    """What cells.publish writes for a capture (its _record's fields, in the order the version before wrote them),
    as JSON read back."""
    history = History()
    for crc in (123, 123, 7):
        history.add(crc)
    record = {**(cap.as_dict() if isinstance(cap, Capture) else cap), "rank": 1,
              "collectives": {"all_reduce": 2, "broadcast": 1},
              "checks": summary({"0": history}, {123: {"op": "all_reduce", "shape": [3]}, 7: {"op": "broadcast"}}),
              "trace": trace.events([("0", 1, "all_reduce", 123, 0.5, 0.75)], {123: {"op": "all_reduce"}}),
              "pg": {"ok": True, "groups": ["0"], "calls": {"0": 3}, "seq": {"0": 3}}, **more}
    return json.loads(fit(record))


def test_every_record_nbdist_publishes_reads_back_as_published(shell):
    shown = published(capture.run_cell(shell, BODY))
    assert [o["kind"] for o in shown["outputs"]] == ["stdout", "stderr", "display"] and shown["result"]
    failed = published(capture.run_cell(shell, "1 / 0\n"), cancelled="rank 0 (h, pid 1) interrupted its cell")
    assert failed["error"]["ename"] == "ZeroDivisionError"
    skipped = {**cells.skipped((0, 1)).as_dict(), "rank": 2, "collectives": {},
               "pg": {"ok": False, "why": "no process group"}}
    huge = published({"outputs": [{"kind": "stdout", "text": "x" * 300_000}], "result": None, "error": None,
                      "wall": 2})  # cut to the store's size: still a record
    for record in (shown, failed, skipped, huge, cells.skipped((3,)).as_dict()):  # the last: as the version before
        text = json.dumps(record)                                                      # may write
        read = Capture.read(text)
        assert read is not None and read.as_dict() == record
        if isinstance(record["wall"], float):  # a whole number of seconds (not nbdist's) reads as a float
            assert json.dumps(read.as_dict()) == text  # written back text for text: the same fields, in order
    assert isinstance(failed_read := Capture.from_dict(failed), Capture) and isinstance(failed_read.error, Raised)
    assert failed_read.error.ename == "ZeroDivisionError" and failed_read.error.interrupted is False
    assert failed_read.cancelled == "rank 0 (h, pid 1) interrupted its cell" and failed_read.rank == 1


def test_a_typed_capture_reads_back_as_itself_and_leaves_out_what_it_does_not_say():
    raised = Raised(ename="PeerFailedError", evalue="rank 0 failed", traceback="tb", short="s", where="`f()`, line 2",
                    interrupted=False, consequence=True)
    full = Capture(outputs=[{"kind": "stdout", "text": "hi\n"}, {"kind": "display", "data": {"text/plain": "x"}}],
                   result={"text/plain": "42"}, error=raised, wall=1.5, rank=3, collectives={"all_reduce": 1},
                   checks={"groups": {}, "sigs": {}}, trace=[{"group": "0", "seq": 1, "op": "all_reduce",
                                                             "bytes": 12, "enter": 0.5, "leave": 0.75}],
                   pg={"ok": True, "groups": ["0"]}, cancelled="rank 0 failed")
    bare = Capture(outputs=[], result=None, error=Raised(ename="CaptureError", evalue="v"), wall=0.0)
    for cap in (full, bare, cells.skipped((1,))):
        assert Capture.from_json(json.dumps(cap.as_dict())) == cap
    assert bare.as_dict() == {"outputs": [], "result": None, "error": {"ename": "CaptureError", "evalue": "v"},
                              "wall": 0.0}  # result and error are always said, even as null
    assert list(full.as_dict()) == ["outputs", "result", "error", "wall", "rank", "collectives", "checks", "trace",
                                    "pg", "cancelled"]
    assert list(full.as_dict()["error"]) == ["ename", "evalue", "traceback", "short", "where", "interrupted",
                                             "consequence"]


def test_fields_a_later_version_adds_are_read_past():
    later = {**GOOD, "error": {"ename": "E", "evalue": "v", "hint": "x"}, "gpu": {"mem": 1}}
    assert Capture.from_dict(later) == Capture.from_dict({**GOOD, "error": {"ename": "E", "evalue": "v"}})


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
    ({"error": {"ename": "E", "evalue": "v", "where": None}}, "its 'error'['where'] is null, not text"),
    ({"error": "boom"}, "its 'error' is \"boom\", not a JSON object"),
    ({"error": None, "result": None, "outputs": [{"kind": "note", "text": 3}]}, "its 'outputs'[0]['text'] is 3, "
     "not text"),
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
