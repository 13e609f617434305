"""A heartbeat (``hb/<session>``) is one typed record, :class:`nbdist.world.pulse.Beat`, written and read through one
codec: what the pulse and the kernel's thread write is what the store has always held; a beat that is not one is no
beat, to a peer and to the heartbeat's own thread, which then keeps beating itself. Real server, real TCP."""

from __future__ import annotations

import json
import threading
import time

import pytest

from nbdist.world import heartbeat, keys
from nbdist.world.liveness import PeerTracker
from nbdist.world.pulse import STOPPED, Beat, beat_from
from nbdist.world.records import MalformedRecord, Registration
from nbdist.world.store import StoreClient

# What each writer has always written (the pulse's beat_for, Heartbeat's thread and Heartbeat.stop).
WIRE = [
    (Beat(3, 5.5, 0.2, False, 41, 42, 1), {"n": 3, "t": 5.5, "pid": 41, "pulse": 42, "rank": 1, "busy": 0.2}),
    (Beat(4, 6.5, 0.0, True, 41, 42, None), {"n": 4, "t": 6.5, "pid": 41, "pulse": 42, "rank": None, "gone": True}),
    (Beat(-2, 7.5, rank=0), {"n": -2, "t": 7.5, "rank": 0}),
    (Beat(STOPPED, 8.5, rank=0), {"n": "stopped", "t": 8.5, "rank": 0}),
]
GOOD = {"n": 3, "t": 5.5, "pid": 41, "pulse": 42, "rank": 1, "busy": 0.2}


@pytest.mark.parametrize(("beat", "wire"), WIRE, ids=["pulse", "gone", "thread", "stopped"])
def test_every_beat_nbdist_writes_is_what_the_store_has_always_held_and_reads_back(beat, wire):
    assert json.loads(beat.to_json()) == wire and list(beat.record()) == list(wire)
    assert Beat.from_json(beat.to_json()) == beat
    assert beat_from(beat.to_json()) == (None if beat.n == STOPPED else beat)  # a stopped beat reads as none


def test_an_old_style_beat_reads_with_its_defaults():
    assert Beat.from_json('{"n": 3, "t": 1}') == Beat(3, 1.0)
    assert Beat.from_json('{"n": 3, "t": 1, "busy": null, "later": [1]}') == Beat(3, 1.0)


@pytest.mark.parametrize(("change", "why"), [
    ({"n": "3"}, "its 'n' is \"3\", not a whole number or 'stopped'"),
    ({"n": True}, "its 'n' is true, not a whole number or 'stopped'"),
    ({"n": 3.0}, "its 'n' is 3.0, not a whole number or 'stopped'"),
    ({"n": None}, "its 'n' is null, not a whole number or 'stopped'"),
    ({"t": -1}, "its 't' is -1, not a time"),
    ({"t": "now"}, "its 't' is \"now\", not a time"),
    ({"busy": "12"}, "its 'busy' is \"12\", not a number"),
    ({"busy": -1}, "its 'busy' is -1, not a number of seconds"),
    ({"gone": 1}, "its 'gone' is 1, not true or false"),
    ({"pid": "41"}, "its 'pid' is \"41\", not a whole number"),
    ({"pulse": 4.2}, "its 'pulse' is 4.2, not a whole number"),
    ({"rank": "1"}, "its 'rank' is \"1\", not a whole number"),
])
def test_a_beat_that_is_not_one_raises_naming_why_and_reads_as_no_beat(change, why):
    text = json.dumps({**GOOD, **change})
    with pytest.raises(MalformedRecord, match="^" + why + "$"):
        Beat.from_json(text)
    assert beat_from(text) is None


@pytest.mark.parametrize("missing", ["n", "t"])
def test_a_beat_without_its_count_or_time_is_not_one(missing):
    with pytest.raises(MalformedRecord, match=f"^it has no '{missing}'$"):
        Beat.from_dict({k: v for k, v in GOOD.items() if k != missing})


def last_beat(client: StoreClient, key: str) -> Beat:
    """The beat once it reads as stopped, or after 10 s: a thread that ``stop`` no longer waits for (held up past two
    intervals on a loaded machine) leaves it when it returns."""
    deadline = time.monotonic() + 10
    while True:
        text = client.get_if(key)
        beat = Beat.from_json(text) if text is not None else None
        if (beat is not None and beat.n == STOPPED) or time.monotonic() > deadline:
            assert beat is not None, "no beat was ever written"
            return beat
        time.sleep(0.05)


class QuietPulse:
    """A pulse process that runs but has not beaten yet (as in its first 0.1 s): the thread beats until it does."""

    pid = 424242
    running = True

    def beat(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def error(self) -> str:
        return ""


@pytest.mark.timeout(60)
def test_a_beat_that_is_not_one_naming_the_pulse_does_not_stop_the_thread_beating(client, monkeypatch):
    """Anyone can write this kernel's beat: one that names its pulse but is not a beat (a count that is not one) must
    not pass for the pulse's first beat, or the thread would stop beating and the peers would find the rank dead."""
    monkeypatch.setattr(heartbeat.Pulse, "start", classmethod(lambda cls, *args, **kwargs: QuietPulse()))
    key = keys.heartbeat("s1")
    hb = heartbeat.Heartbeat(client.clone(), "s1", 1)
    tracker = PeerTracker([Registration("s0", 0, "h", 1), Registration("s1", 1, "h", 2, keeps_beat=True)], 0)
    try:
        forged = json.dumps({"n": "x", "t": 1.0, "pid": 1, "pulse": QuietPulse.pid, "rank": 1})
        until = time.monotonic() + 2.5  # five looks of the thread
        while time.monotonic() < until:
            client.set(key, forged)
            time.sleep(0.01)
        first = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the thread's own beat, moving
            beat = tracker.beats(client)[1]
            if beat is not None and first is not None and beat.n != first.n:
                break
            first = first or beat
            time.sleep(0.05)
        else:
            pytest.fail(f"the thread no longer beats: the key holds {client.get_if(key)}")
        assert beat.n < 0 and beat.rank == 1  # the thread's, not the pulse's
    finally:
        hb.stop()
    assert last_beat(client, key).n == STOPPED


class HeldBeat(StoreClient):
    """A real connection on which the heartbeat's thread, once ``armed``, is held up just before it writes a beat
    (a kernel given no processor for seconds on a loaded machine), until ``release`` is set. A write from any other
    thread lets the held beat through as soon as it is written, and waits until that beat is in the store."""

    def __init__(self, client: StoreClient) -> None:
        super().__init__(client.host, client.port, client.raw())
        self.marker = client.marker
        self.armed, self.held, self.release, self.through = (threading.Event() for _ in range(4))

    def set(self, key: str, value: str) -> None:
        if threading.current_thread().name != "nbdist-heartbeat":
            super().set(key, value)
            if self.held.is_set():
                self.release.set()
                self.through.wait(10)
            return
        if self.armed.is_set() and not self.held.is_set():
            self.held.set()
            self.release.wait(30)
            super().set(key, value)
            self.through.set()
            return
        super().set(key, value)


@pytest.mark.timeout(60)
def test_a_beat_held_up_past_the_stop_never_lands_after_the_stopped_one(client, monkeypatch):
    """The suite met it once: the thread was given no processor for the two intervals that ``stop`` waits for it,
    ``stop`` wrote the stopped beat, and the thread's beat landed after it, so the rank looked alive again. The
    last beat is the thread's own now, after every beat it wrote."""
    monkeypatch.setattr(heartbeat.Pulse, "start", classmethod(lambda cls, *args, **kwargs: QuietPulse()))
    key = keys.heartbeat("s1")
    held = HeldBeat(client.clone())
    hb = heartbeat.Heartbeat(held, "s1", 1)
    held.armed.set()
    assert held.held.wait(10), "the thread never came to write a beat"
    hb.stop()  # returns after two intervals, the thread still held
    held.release.set()
    last = last_beat(client, key)
    assert last.n == STOPPED, f"the key holds {last} after the stop"
    time.sleep(1.5)  # three intervals of the thread, had it gone on beating
    assert Beat.from_json(client.get_if(key)).n == STOPPED
