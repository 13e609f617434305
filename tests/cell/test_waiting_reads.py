"""What a rank reads while it waits for another (issue 34, item 6): one count a look, and each other rank's record
only once that count says it is in; still named at once when it ended without a collective. Real server, real
TCP, two worlds in one process."""

from __future__ import annotations

import json
import threading
import time

import pytest

from nbdist.cell.fingerprint import Checker, Fingerprint, ended
from nbdist.cell.live import LiveTable
from nbdist.cell.outputlog import OutputLog
from nbdist.errors import CollectiveMismatchError
from nbdist.world import gather, keys
from nbdist.world.capture_record import Capture
from nbdist.world.gather import Gathering
from nbdist.world.records import MalformedRecord
from nbdist.world.store import COUNTS
from nbdist.world.world import step_name

FP = {"op": "all_reduce", "tensor": {"shape": [1], "dtype": "float32", "device": "cpu"}, "reduce_op": "SUM"}


@pytest.fixture
def pair(two_worlds):
    waiting, other = two_worlds
    return waiting, other, step_name(waiting.turns.next())


def ops() -> int:
    return COUNTS.ops


def end_body(world, cell: str, collectives: int) -> None:
    """What a rank does as its body ends (nbdist.cell.cells): its record in, then its arrival at the end counted."""
    record = {"outputs": [], "result": None, "error": None, "wall": 0.1, "rank": world.rank,
              "collectives": {"0": collectives} if collectives else {}}
    world.client.set(world.key(keys.out(cell, world.rank)), json.dumps(record))
    world.client.add(world.key(keys.ended(cell)), 1)


def test_a_look_while_nobody_ended_is_one_store_operation(pair):
    waiting, _, cell = pair
    published = ended(waiting, cell)
    before = ops()
    for _ in range(5):
        assert published.look(waiting.client, [1]) == {}
    assert ops() - before == 5


def test_a_record_is_read_once_after_its_count_moved_and_never_again(pair):
    waiting, other, cell = pair
    published = ended(waiting, cell)
    published.look(waiting.client, [1])
    end_body(other, cell, collectives=1)
    assert published.look(waiting.client, [1])[1].collectives == {"0": 1}
    before = ops()
    assert published.look(waiting.client, [1])[1].rank == 1
    assert ops() - before == 1


def test_a_rank_that_ended_without_the_collective_is_named_at_the_next_tick(pair):
    waiting, other, cell = pair
    checker = Checker(waiting, cell, timeout=60.0, params={})
    checker._peer_finished("0", 1, FP, None)  # the other still runs its body: nothing to say
    before = ops()
    checker._peer_finished("0", 1, FP, None)
    assert ops() - before == 1  # one count read, whatever the world's size
    end_body(other, cell, collectives=0)
    with pytest.raises(CollectiveMismatchError, match=r"rank 1 \(h, pid 2\) finished this cell after 0 collective"):
        checker._peer_finished("0", 1, FP, None)


def test_a_rank_that_ended_after_the_collective_is_not_named_until_a_later_one(pair):
    waiting, other, cell = pair
    checker = Checker(waiting, cell, timeout=60.0, params={})
    end_body(other, cell, collectives=1)
    checker._peer_finished("0", 1, FP, None)  # it issued #1: no mismatch
    with pytest.raises(CollectiveMismatchError, match="after 1 collective"):
        checker._peer_finished("0", 2, FP, None)  # read from the record already found, no read again


def test_a_record_that_is_not_one_is_not_found_and_the_real_one_is_read_when_the_count_moves_again(pair):
    """Anyone can write a rank's record: a waiting collective's watch reads it as not there, never fails on it."""
    waiting, other, cell = pair
    checker = Checker(waiting, cell, timeout=60.0, params={})
    for garbage in ("not json", '{"collectives": "many"}'):
        other.client.set(other.key(keys.out(cell, 1)), garbage)
        other.client.add(other.key(keys.ended(cell)), 1)
        checker._peer_finished("0", 1, FP, None)  # not read as a rank that ended without the collective
        assert checker._ended.found == {}
    end_body(other, cell, collectives=0)
    with pytest.raises(CollectiveMismatchError, match="after 0 collective"):
        checker._peer_finished("0", 1, FP, None)


@pytest.mark.parametrize("garbage", ["not json", "[1]", '{"op": 7, "seq": 1}', '{"op": "all_reduce"}'])
def test_a_fingerprint_that_is_not_one_is_left_out_of_the_last_arrivals_comparison_never_raised_from_it(pair, garbage):
    """Anyone can write a member's fingerprint: the comparison the last to arrive makes leaves it out, as one not in."""
    waiting, other, cell = pair
    base = keys.compared(cell, "0", 1)
    other.client.set(other.key(keys.member(base, 1)), garbage)
    opened = []
    early = threading.Thread(target=lambda: opened.append(gather.barrier(other, Gathering(base, "rank 1 at #1", 20.0))),
                             daemon=True)
    early.start()
    while not waiting.client.check([waiting.key(keys.arrivals(base))]):  # rank 1 is in first: rank 0 compares
        time.sleep(0.02)
    Checker(waiting, cell, timeout=20.0, params={}).agree(dict(FP), "0", 1, None)
    early.join(20)
    assert opened and opened[0].opened


def test_a_fingerprint_nbdist_publishes_reads_back_as_published_and_one_that_is_not_one_reads_as_none():
    fp = {**FP, "seq": 3}
    assert Fingerprint.read(json.dumps(fp)) == fp and Fingerprint.from_json(json.dumps(fp)).to_json() == json.dumps(fp)
    for text, why in (("x", "not a JSON object"), ('{"seq": 1}', "it has no 'op'"),
                      ('{"op": "all_reduce", "seq": "1"}', "its 'seq' is \"1\", not a whole number")):
        with pytest.raises(MalformedRecord, match="^" + why + "$"):
            Fingerprint.from_json(text)
        assert Fingerprint.read(text) is None


class Shown:
    """Where a notebook's displays go (the kernel's display publisher): the last table it was given."""

    def __init__(self) -> None:
        self.html = ""

    def publish(self, data, metadata=None, transient=None, update=False) -> None:
        self.html = data["text/html"]


def test_the_live_table_reads_the_others_parts_only_when_their_count_moved(pair):
    shower, other, cell = pair
    shown = Shown()
    table = LiveTable(shower, cell, "cell", OutputLog(), shown)
    theirs = LiveTable(other, cell, "cell", OutputLog(), None)
    table._show(0.0)
    assert "running" in shown.html and "finished" not in shown.html
    # Not yet shown anywhere, not 0.5 s in: publishes nothing.
    theirs.finish(Capture(outputs=[], result=None, error=None, wall=1.5))
    theirs._publish(force=True)
    before = ops()
    table._show(1.0)
    assert ops() - before == 3  # the count, the list of ranks that published, their parts in one multi_get
    assert "finished in 1.5 s" in shown.html
    before = ops()
    table._show(2.0)
    assert ops() - before == 1  # nothing moved: the count only
    assert "finished in 1.5 s" in shown.html
    table._publish(force=True)  # its own part moves the count too, and it knows nobody else's did
    before = ops()
    table._show(3.0)
    assert ops() - before == 1


def test_the_live_table_shows_no_part_that_is_not_one(pair):
    shower, other, cell = pair
    shown = Shown()
    other.client.set(other.key(keys.live(cell, 1)), "not json")
    other.client.append(other.key(keys.live_ranks(cell)), "1,7,x,")
    other.client.add(other.key(keys.live_count(cell)), 1)
    LiveTable(shower, cell, "cell", OutputLog(), shown)._show(0.0)
    assert "running" in shown.html
