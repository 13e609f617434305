"""A breakpoint's record (``bp/ask/<n>``) is validated where the driving notebook reads it: what a driven rank writes
reads back as written; one that is not one, even sealed with the world's key, is not answered (logged), never an
error in the driving notebook's wait, and the breakpoints after it are still answered. Real server, real TCP."""

from __future__ import annotations

import io
import json

import pytest

from nbdist.debug import breakpoints
from nbdist.world import keys, signing
from nbdist.world.records import MalformedRecord

from .test_breakpoint_protocol import CELL, KEY, ROUND, RankOne, answer_from_rank_zero

TOKEN = "bp-test-token"  # the store's, and the world's key (test_breakpoint_protocol.KEY)
STOPPED = {"n": 1, "round": ROUND, "rank": 1, "cell": CELL, "line": 3, "t": 12.5}


@pytest.mark.parametrize("stopped", [breakpoints.Stopped(1, ROUND, 1, CELL, 3, 12.5),
                                     breakpoints.Stopped(2, 0, 0, keys.step(1))])
def test_every_breakpoint_record_nbdist_writes_reads_back_as_written(stopped):
    sealed = json.loads(json.dumps(signing.seal(KEY, breakpoints.ASK, stopped.record())))
    assert breakpoints.Stopped.from_dict(sealed) == stopped
    assert breakpoints.Stopped.read(sealed, KEY, stopped.n, stopped.round) == stopped


@pytest.mark.parametrize(("change", "why"), [
    ({"rank": "1"}, "its 'rank' is \"1\", not a whole number"),
    ({"rank": None}, "its 'rank' is null, not a whole number"),
    ({"rank": -1}, "its 'rank' is -1, below 0"),
    ({"rank": 1.5}, "its 'rank' is 1.5, not a whole number"),
    ({"cell": 12}, "its 'cell' is 12, not text"),
    ({"line": "3"}, "its 'line' is \"3\", not a whole number"),
    ({"line": True}, "its 'line' is true, not a whole number"),
    ({"t": "now"}, "its 't' is \"now\", not a number"),
])
def test_a_breakpoint_record_that_is_not_one_raises_naming_why_and_does_not_verify_even_sealed(change, why):
    record = {**STOPPED, **change}
    with pytest.raises(MalformedRecord, match="^" + why + "$"):
        breakpoints.Stopped.from_dict(record)
    assert breakpoints.Stopped.read(signing.seal(KEY, breakpoints.ASK, record), KEY, 1, ROUND) is None


@pytest.mark.parametrize("missing", ["rank", "cell"])
def test_a_breakpoint_record_without_its_rank_or_cell_is_not_one(missing):
    with pytest.raises(MalformedRecord, match=f"^it has no '{missing}'$"):
        breakpoints.Stopped.from_dict({k: v for k, v in STOPPED.items() if k != missing})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("change", [{"rank": "one"}, {"rank": None}, {"line": "3; rm -rf"}])
def test_a_sealed_breakpoint_record_that_is_not_one_is_passed_over_and_the_next_is_answered(client, caplog, change):
    n = client.add(keys.in_round(ROUND, keys.BP_ASKS), 1)
    client.set_json(keys.in_round(ROUND, keys.bp_ask(n)), signing.seal(KEY, breakpoints.ASK, {**STOPPED, **change}))
    rank_one = RankOne(client)  # its breakpoint is the next record, #2
    with caplog.at_level("WARNING"):
        shown, prompts = answer_from_rank_zero(client, ["p x", "c"], rank_one)
    assert f"a breakpoint record (#{n}) did not verify" in caplog.text
    assert rank_one.error is None and rank_one.y == 42, rank_one.error
    assert shown.count("stopped at a breakpoint") == 1 and "rm -rf" not in shown, shown
    assert len(prompts) == 2 and "\n41\n" in shown, shown


def test_a_driven_rank_writes_its_breakpoint_as_a_sealed_record(client):
    rank_one = RankOne(client)
    rank_one.here._gone = lambda: (lambda: "the test is over")  # type: ignore[method-assign]  # quits at once
    rank_one.here.out = io.StringIO()
    rank_one.start()
    rank_one.join(30)
    record = client.get_json_if(keys.in_round(ROUND, keys.bp_ask(1)))
    stopped = breakpoints.Stopped.read(record, KEY, 1, ROUND)
    assert stopped is not None and stopped == breakpoints.Stopped(1, ROUND, 1, CELL, None, stopped.t)  # no cell line
