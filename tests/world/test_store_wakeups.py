"""Waits that a read of the missing key does not end (torch's TCPStore wakes them), and a follower that starts
while its driver publishes: real server, real TCP."""

from __future__ import annotations

import json
import threading
import time

from nbdist.world import gather
from nbdist.world import verdict as verdicts
from nbdist.world.gather import Gathering
from nbdist.world.records import Note, Registration
from nbdist.world.store import Server, connect
from nbdist.world.world import World

RANKS = [Registration(session="s0", rank=0, host="h", pid=1), Registration(session="s1", rank=1, host="h", pid=2)]


NONE = Note("no note", 0.0)


def test_a_barrier_waits_on_while_another_client_reads_its_missing_state_key(port):
    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(3)]
    try:
        a, b, spy = clients
        # What this guards against, as torch does it: a compare-and-set that reads a missing key wakes its waits.
        woken: dict = {}
        waiter = threading.Thread(target=lambda: woken.update(done=a.wait(["probe"], 5.0)), daemon=True)
        waiter.start()
        time.sleep(0.3)
        assert spy.get_if("probe") is None
        waiter.join(3)
        assert "done" in woken and not spy.check(["probe"])  # woken, though nothing was set

        worlds = [World(c, 0, i, 2, RANKS[i], RANKS) for i, c in enumerate((a, b))]
        box: dict = {}
        meeting = Gathering("g0/t/1", "a test barrier", 30)
        t = threading.Thread(target=lambda: box.update(state=gather.barrier(worlds[0], meeting)), daemon=True)
        t.start()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert spy.get_if("r/0/g0/t/1/state") is None
            time.sleep(0.05)
        assert t.is_alive() and "state" not in box, box
        assert gather.barrier(worlds[1], meeting) == verdicts.GO
        t.join(10)
        assert box.get("state") == verdicts.GO, box
    finally:
        for c in clients:
            c.close()
        server.stop()


def test_a_follower_that_starts_while_the_driver_publishes_takes_that_cell(port):
    """The driver numbers a message (add), signs it, then writes it (set): a follower that starts in between must
    wait for that message, not the next one (it did, and the driver then waited for it at the cell's start)."""
    from nbdist.drive import follow
    from nbdist.world import signing

    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(2)]
    try:
        driver, follower = (World(c, 0, i, 2, RANKS[i], RANKS) for i, c in enumerate(clients))
        cell = signing.sign(signing.key_from("secret"), {
            "round": 0, "seq": 1, "driver": 0, "session": "s0", "kind": "collective", "source": "1", "flags": {},
            "gen": 0, "number": 1, "t": time.time()})
        driver.client.add(driver.key(follow.SEQ), 1)  # numbered, written a moment later
        late = threading.Timer(0.3, lambda: clients[0].set(driver.key("drive/1"), json.dumps(cell)))
        late.start()
        assert follow.Follower(follower, "s1", "secret").seq == 1
        late.join()
        assert follow.Follower(follower, "s1", "secret").seq == 1  # written, its cell not started: still due
        driver.client.add(driver.key(follow.SEQ), 1)  # numbered, never written (a publish that failed)
        assert follow.Follower(follower, "s1", "secret").seq == 3
    finally:
        for c in clients:
            c.close()
        server.stop()


def test_a_rank_recorded_waiting_at_a_barrier_that_has_opened_reads_as_past_it(port):
    # Status right after a cell: the slowest rank has not yet recorded that it got through the cell's end.
    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(2)]
    try:
        worlds = [World(c, 0, i, 2, RANKS[i], RANKS) for i, c in enumerate(clients)]
        end = Gathering("g0/t/2", "%%collective #1 (end)", 30, then="finished %%collective #1")
        t = threading.Thread(target=lambda: gather.barrier(worlds[0], end), daemon=True)
        t.start()
        deadline = time.monotonic() + 5
        while (worlds[1].notes.last(0) or NONE).barrier is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (worlds[1].notes.last(0) or NONE).what == "waiting at %%collective #1 (end)"  # not open yet: waiting
        assert gather.barrier(worlds[1], end) == verdicts.GO
        t.join(5)
        assert (worlds[1].notes.last(0) or NONE).what == "finished %%collective #1"  # as it will record
        worlds[0].notes.write("running %%collective #2")
        # TCPStore's set is not answered: another connection sees it a moment later.
        deadline = time.monotonic() + 5
        while (worlds[1].notes.last(0) or NONE).what != "running %%collective #2" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (worlds[1].notes.last(0) or NONE).what == "running %%collective #2"  # its next record is shown as it is
        # Rank 1 arrived last and opened it: before its next record it reads as past it too, not as still running
        # its body (a 16-rank CI run read "running %%collective #1" for the rank that opened the cell's end).
        assert (worlds[0].notes.last(1) or NONE).what == "finished %%collective #1"
    finally:
        for c in clients:
            c.close()
        server.stop()
