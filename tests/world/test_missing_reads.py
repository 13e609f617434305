"""Who a barrier still waits for, read at a constant cost once every rank has a note (issue 34, item 6): the notes
of the ranks seen to have one in one ``multi_get``, since a note is replaced but never removed. Real server, real
TCP, two worlds in one process."""

from __future__ import annotations

from nbdist.world import gather, keys, records
from nbdist.world.store import COUNTS

from ..conftest import written

BARRIER = "t/1/out"


def test_a_rank_with_no_note_yet_is_read_alone_and_counts_as_missing(two_worlds):
    waiting, _ = two_worlds
    for _ in range(2):
        before = COUNTS.snapshot()["kinds"].get("compare_set", [0])[0]
        assert gather.not_arrived(waiting, BARRIER, None) == {1: None}
        assert COUNTS.snapshot()["kinds"]["compare_set"][0] - before == 1  # one read, until it has a note


def test_once_a_rank_has_a_note_every_look_reads_the_notes_in_one_multi_get(two_worlds):
    waiting, other = two_worlds
    other.notes.write("running %%collective #1")
    written(other)  # read next by the other world's connection
    assert gather.not_arrived(waiting, BARRIER, None)[1].what == "running %%collective #1"
    other.notes.write("waiting at %%collective #1 (end)", barrier=BARRIER)
    written(other)  # read next by the other world's connection
    before = COUNTS.snapshot()
    assert gather.not_arrived(waiting, BARRIER, None) == {}  # it arrived: read again, as it is now
    moved = COUNTS.delta(before, COUNTS.snapshot())
    assert moved["ops"] == 1 and moved["kinds"]["multi_get"][0] == 1


def test_the_message_of_a_wait_that_gives_up_names_who_did_not_arrive_and_what_it_did(two_worlds):
    waiting, other = two_worlds
    other.notes.write("running %%collective #1", body="t/1")
    written(other)  # read next by the other world's connection
    waiting.notes.write("waiting at %%collective #1 (end)", barrier=BARRIER)
    message = gather.who_is_missing(waiting, BARRIER, 5.0, "%%collective #1 (end)")
    assert message.startswith("%%collective #1 (end): not every rank arrived within 5 s. Missing: rank 1 (h, pid 2)")
    assert "last: running %%collective #1" in message and "rank 0" not in message
    other.notes.write("waiting at %%collective #1 (end)", barrier=BARRIER)
    written(other)  # read next by the other world's connection
    assert "Missing: none" in gather.who_is_missing(waiting, BARRIER, 5.0, "%%collective #1 (end)")


def test_what_a_missing_rank_does_reads_its_guards_record_and_ignores_one_that_is_not_its_guards(two_worlds):
    """A rank's busy record (its guard's: whether it runs a cell) is anyone's to write: one that is not a record
    says nothing, and a barrier outside cells does not wait for that rank as if it ran one."""
    waiting, other = two_worlds
    other.notes.write("joined")
    other.client.set(other.key(keys.busy(1)), records.Busy(True, 1.0).to_json())
    written(other)  # read next by the other world's connection
    assert waiting.notes.doing(1).startswith("running a cell; last: joined") and waiting.notes.busy_elsewhere(1, None)
    for text in ("not json", '{"busy": "yes", "t": 1}', '{"busy": false, "t": "then"}'):
        other.client.set(other.key(keys.busy(1)), text)
        written(other)  # read next by the other world's connection
        assert waiting.notes.doing(1).startswith("last: joined") and not waiting.notes.busy_elsewhere(1, None)

