"""A waiting rank reads its peers' heartbeats at a constant cost (issue 34, item 6): once a peer's beat is seen, and
the peer said at its join that its beat stays (``keeps_beat``: a heartbeat stopped on purpose leaves its last beat),
every look reads the beats in one ``multi_get``. Real server, real TCP, a real Heartbeat with its pulse process."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nbdist.world import liveness, pulse
from nbdist.world.heartbeat import Heartbeat
from nbdist.world.liveness import PeerTracker
from nbdist.world.records import Registration
from nbdist.world.store import COUNTS, connect

RANKS = [Registration(session=f"s{i}", rank=i, host="h", pid=i, keeps_beat=True) for i in range(4)]
# a kernel of the version before: it removes its beat when it stops
RANKS[3] = Registration(session="s3", rank=3, host="h", pid=3)


def beat(client, i: int, n: int) -> None:
    client.set(f"hb/s{i}", json.dumps({"n": n, "t": 1.0, "rank": i, "busy": 0.0}))


def moved(look):
    before = COUNTS.snapshot()
    got = look()
    return got, COUNTS.delta(before, COUNTS.snapshot())["kinds"]


def test_the_beats_seen_are_read_together_the_others_one_by_one(client):
    tracker = PeerTracker(RANKS, 0)
    beat(client, 1, 1)
    beats, kinds = moved(lambda: tracker.beats(client))
    assert beats[1].n == 1 and beats[2] is None and beats[3] is None
    assert set(kinds) == {"check", "compare_set"}  # looked for together (not all there), then one read each
    assert kinds["check"][0] == 1 and kinds["compare_set"][0] == 3
    for i in (2, 3):
        beat(client, i, 1)
    tracker.beats(client)
    beats, kinds = moved(lambda: tracker.beats(client))
    assert [beats[i].n for i in (1, 2, 3)] == [1, 1, 1]
    assert kinds["multi_get"][0] == 1 and kinds["compare_set"][0] == 1  # ranks 1 and 2 together; rank 3 alone


def test_a_first_look_at_peers_that_all_beat_reads_them_together_not_one_by_one(client):
    """Issue 50: in the simulated world's first cell, each of 256 ranks read 255 beats one by one (65,280 reads)."""
    ranks = [Registration(session=f"s{i}", rank=i, host="h", pid=i, keeps_beat=True) for i in range(6)]
    for i in range(1, 6):
        beat(client, i, 1)
    tracker = PeerTracker(ranks, 0)
    beats, kinds = moved(lambda: tracker.beats(client))
    assert [beats[i].n for i in range(1, 6)] == [1] * 5
    assert kinds == {"check": kinds["check"], "multi_get": kinds["multi_get"]}
    assert kinds["check"][0] == 1 and kinds["multi_get"][0] == 1


def test_a_stopped_heartbeat_stays_and_reads_as_none_and_the_look_does_not_wait(client, port):
    tracker = PeerTracker(RANKS[:2], 0)
    hb = Heartbeat(connect("127.0.0.1", port), "s1", 1)
    try:
        deadline = pulse.time.monotonic() + 30
        while tracker.beats(client)[1] is None:  # its first beat (the pulse's, or the thread's)
            assert pulse.time.monotonic() < deadline, "no beat within 30 s"
            pulse.time.sleep(0.05)
        assert 1 in tracker._kept  # noqa: SLF001 (what the next look reads together)
    finally:
        hb.stop()
    assert json.loads(client.get("hb/s1"))["n"] == pulse.STOPPED  # left in the store, no longer moving
    beats, kinds = moved(lambda: tracker.beats(client))
    assert beats == {1: None} and kinds["multi_get"][0] == 1  # read with the rest, at once; a stopped beat is none
    assert pulse.beat_from('{"n": 3, "t": 5, "pid": 9, "later": 1}') == pulse.Beat(3, 5.0, pid=9)  # unknown: read past


@pytest.mark.parametrize("text", ["not json", "[1]", '{"n": 3}', '{"n": "3", "t": 1}', '{"n": true, "t": 1}',
                                  '{"n": 3, "t": -1}', '{"n": 3, "t": 1, "busy": "12"}', '{"n": 3, "t": 1, "gone": 1}'])
def test_a_beat_that_is_not_one_reads_as_none_and_its_rank_as_silent_not_as_an_error(client, text):
    """Anyone can write a peer's beat: a waiting rank's peer check reads it as no beat (the peer is dead once the
    real one has not moved for DEAD_AFTER), never fails on it."""
    assert pulse.beat_from(text) is None
    client.set("hb/s1", text)
    tracker = PeerTracker(RANKS[:2], 0)
    assert tracker.beats(client) == {1: None} and tracker.dead(client) == []  # within the grace: not dead yet


class _SlowReads:
    """A store whose every read takes 3 s of the tracker's clock: a large world's first look, one read per peer."""

    def __init__(self, clock, texts: dict[str, str]) -> None:
        self.clock, self.texts = clock, texts

    def get_if(self, key: str) -> str | None:
        self.clock.now += 3.0
        return self.texts.get(key)

    def check(self, keys: list[str]) -> bool:
        self.clock.now += 3.0
        return all(k in self.texts for k in keys)

    def multi_get(self, keys: list[str]) -> list[str]:
        self.clock.now += 3.0
        return [self.texts[k] for k in keys]


def test_a_look_that_reads_for_longer_than_dead_after_dates_the_beats_it_read_to_its_end(monkeypatch):
    """Found by the simulated world at 256 ranks (benchmarks/simulated_world.py): the first look read 255 beats
    one by one for over 5 s, dated them to its start, and the next look, a moment later, found the last ones read
    unmoved "for 5 s" and called live ranks dead."""
    from nbdist.world import liveness

    clock = type("Clock", (), {"now": 0.0, "monotonic": lambda self: self.now})()
    monkeypatch.setattr(liveness, "time", clock)
    store = _SlowReads(clock, {f"hb/s{i}": json.dumps({"n": 1, "t": 1.0, "rank": i}) for i in (1, 2)})
    tracker = PeerTracker(RANKS[:3], 0)
    assert tracker.dead(store) == []  # two reads (a check, a multi_get): the clock reads 6 s at its end
    assert tracker.dead(store) == []  # began at 6 s, read until 9 s, unmoved since the first look ended: alive
    clock.now += 3.0
    assert [i for i, _ in tracker.dead(store)] == [1, 2]  # read until 15 s, unmoved for 9 s: dead


def test_a_look_reads_every_peer_in_a_world_of_up_to_watched_plus_one_ranks():
    for size in (2, 3, liveness.WATCHED + 1):
        for me in range(size):
            assert sorted(liveness.looked_at(me, size, 0)[0]) == [i for i in range(size) if i != me]


def test_in_a_large_world_a_look_reads_the_next_ranks_and_some_of_the_rest_in_turn_so_waiting_is_linear():
    """Issue 50: 1,024 waiting ranks read about 32,000 beats a look, not a million; each rank is read by the 16
    before it every look, and by every rank within a round of the rest."""
    size, me = 1024, 1000
    looked, turn = liveness.looked_at(me, size, 0)
    assert len(looked) == len(set(looked)) == liveness.WATCHED + liveness.ROTATED and me not in looked
    assert looked[:liveness.WATCHED] == [(me + k) % size for k in range(1, liveness.WATCHED + 1)]
    seen, looks = set(looked), 1
    while len(seen) < size - 1:
        looked, turn = liveness.looked_at(me, size, turn)
        seen.update(looked)
        looks += 1
    assert me not in seen and looks == -(-(size - 1 - liveness.WATCHED) // liveness.ROTATED)  # 63 looks
    readers = Counter(i for r in range(size) for i in liveness.looked_at(r, size, r)[0])
    assert sum(readers.values()) == size * 32 and min(readers.values()) >= liveness.WATCHED


def test_a_large_worlds_tracker_reads_what_its_look_names_and_a_watch_of_one_rank_reads_that_one(client):
    ranks = [Registration(session=f"s{i}", rank=i, host="h", pid=i, keeps_beat=True) for i in range(40)]
    for i in range(40):
        beat(client, i, 1)
    tracker = PeerTracker(ranks, 30)
    beats, kinds = moved(lambda: tracker.beats(client))
    assert sorted(beats) == sorted(liveness.looked_at(30, 40, 0)[0]) and len(beats) == 32
    assert kinds == {"check": kinds["check"], "multi_get": kinds["multi_get"]}  # together, not one by one
    assert tracker.beats(client, [5]) == {5: pulse.Beat(1, 1.0, rank=5)} and tracker.dead(client, [5]) == []
    client.set("hb/s5", json.dumps({"n": 1, "t": 1.0, "rank": 5, "gone": True}))
    assert [i for i, _ in tracker.dead(client, [5])] == [5]
