"""A cell's end and a collective's comparison, at scale: the last rank to arrive reads every rank's record once and
tells the others what it found; a rank that shows no table reads no other rank's record unless it failed (issue
34, "cheap at scale"). Real server, real TCP, N worlds in one process, each rank in a thread of its own."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from nbdist.cell import cellerror, cells, ending
from nbdist.cell.fingerprint import Checker, differences
from nbdist.cell.turn import Turn
from nbdist.errors import CollectiveError, CollectiveMismatchError
from nbdist.world import keys, store
from nbdist.world import verdict as verdicts
from nbdist.world.capture_record import Capture
from nbdist.world.records import Registration
from nbdist.world.store import Server, StoreCounts, connect
from nbdist.world.world import World, step_name

from ..conftest import free_port

WAIT = 30.0  # every wait's timeout: a rank that regresses waits it out, then fails
OUTPUT = "epoch 3: loss 0.4215, accuracy 0.8731, 1,024 samples in 0.31 s on this rank\n" * 3  # a cell's few lines


class Group:
    """A process group as the cell judges it: trusted unless ``why`` says otherwise; what the cell distrusted."""

    def __init__(self, why: str | None = None) -> None:
        self.why, self.distrusted = why, []

    def state(self) -> dict[str, Any]:
        return {"ok": True} if self.why is None else {"ok": False, "why": self.why}

    def distrust(self, why: str) -> None:
        self.distrusted.append(why)


class ByThread:
    """``store.COUNTS`` kept per thread: each simulated rank runs in a thread of its own (the store counts a
    whole process, and here every rank shares one). ``every``: each thread's counts."""

    def __init__(self) -> None:
        object.__setattr__(self, "_local", threading.local())
        object.__setattr__(self, "every", [])

    def mine(self) -> StoreCounts:
        local = self._local
        if not hasattr(local, "counts"):
            local.counts = StoreCounts()
            self.every.append(local.counts)
        return local.counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mine(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.mine(), name, value)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> ByThread:
    by_thread = ByThread()
    monkeypatch.setattr(store, "COUNTS", by_thread)
    return by_thread


@contextlib.contextmanager
def formed(port: int, n: int, distrusting: dict[int, str] | None = None) -> Iterator[list[World]]:
    """``n`` ranks that just joined one world; ``distrusting``: ranks whose group cannot be trusted, and why."""
    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(n)]
    ranks = [Registration(session=f"s{i}", rank=i, host="h", pid=i + 1) for i in range(n)]
    try:
        worlds = [World(c, 0, i, n, ranks[i], ranks) for i, c in enumerate(clients)]
        for w in worlds:
            w.last_turn = w.turns.next() - 1
            w.pg = Group((distrusting or {}).get(w.rank))
            # The world's own checks run on a clock (every 0.5 s, every 1 s), whatever the cells: not a cell's cost.
            w.checks._next_round_check = w.checks._next_peer_check = math.inf
        yield worlds
    finally:
        for c in clients:
            c.close()
        server.stop()


def capture(rank: int, error: dict[str, Any] | None = None) -> Capture:
    return Capture.from_dict({"outputs": [{"kind": "stdout", "text": f"rank {rank}: {OUTPUT}"}], "result": None,
                              "error": error, "wall": 0.01})


def counted_in(world: World, meeting: str, at_least: int = 1) -> None:
    """Wait until ``at_least`` ranks are counted in at ``meeting`` (this rank's own reads, on its own thread)."""
    deadline = time.monotonic() + WAIT
    while world.client.add(world.key(keys.arrivals(meeting)), 0) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"nobody arrived at {meeting} within {WAIT:g} s")
        time.sleep(0.005)


def run_cell(worlds: list[World], first: int, shows: set[int], errors: dict[int, dict[str, Any]] | None = None,
             counts: ByThread | None = None) -> dict[int, dict[str, Any]]:
    """One %%collective on every rank; ``first`` arrives first at its start and at its end (so it decides neither);
    ranks in ``shows`` show the table. Per rank: its outcome (or error) and the store traffic of its cell."""
    step = worlds[0].turns.next()
    cell = step_name(step)
    results: dict[int, dict[str, Any]] = {}

    def body(b: cells.Body) -> cells.Ran:
        if b.world.rank != first:
            counted_in(b.world, keys.ending(cell))
        return capture(b.world.rank, (errors or {}).get(b.world.rank)), None, False

    def rank(world: World) -> None:
        if world.rank != first:
            counted_in(world, keys.arrival(step))
        before = counts.snapshot() if counts is not None else None
        claimed = Turn()
        claimed.claim(step)
        try:
            outcome: Any = cells.run(world, SimpleNamespace(user_ns={}), "x = RANK\n", cells.Flags(WAIT, live=False),
                                     world.client, {}, activate=lambda _: None, rebuild=lambda _: None, turn=claimed,
                                     state={"ok": True, "gen": 0}, draw_live=False, run_body=body,
                                     shows_table=world.rank in shows)
        except BaseException as exc:  # read by the test
            outcome = exc
        moved = None if counts is None or before is None else StoreCounts.delta(before, counts.snapshot())
        results[world.rank] = {"outcome": outcome, "moved": moved}

    threads = [threading.Thread(target=rank, args=(w,), daemon=True) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT)
    assert len(results) == len(worlds), f"ranks {sorted(set(range(len(worlds))) - set(results))} never ended"
    return results


def every_record(world: World, cell: str) -> list[Capture | None]:
    texts = world.client.multi_get([world.key(keys.out(cell, i)) for i in range(world.world_size)])
    return [Capture.from_json(t) for t in texts]


def test_what_a_rank_that_shows_no_table_reads_per_cell_does_not_grow_with_the_world(port, counts):
    """Rank 1 (a spawned worker) shows no table: at 2 and at 8 ranks its cell reads the same bytes, no other rank's
    record; rank 0 (the driving notebook) shows the table, with every rank's capture."""
    read: dict[int, dict[str, Any]] = {}
    for n in (2, 8):
        with formed(port if n == 2 else free_port(), n) as worlds:
            run_cell(worlds, first=1, shows={0}, counts=counts)  # the first cell of a world: not counted
            results = run_cell(worlds, first=1, shows={0}, counts=counts)
        for r in results.values():
            assert isinstance(r["outcome"], cells.Outcome), r["outcome"]
        worker, driver = results[1]["outcome"], results[0]["outcome"]
        assert worker.captures[1].outputs == capture(1).outputs
        assert [c is None for c in worker.captures] == [i != 1 for i in range(n)]
        assert [c.outputs for c in driver.captures] == [capture(i).outputs for i in range(n)]
        assert worker.distrusted is None and worker.mismatch is None and cellerror.error_for(worlds[1], worker) is None
        read[n] = results[1]["moved"]
        assert "multi_get" not in read[n]["kinds"], read[n]
        assert sum(results[i]["moved"]["kinds"].get("multi_get", [0])[0] for i in range(n)) <= 3  # start, end, driver
    assert read[8]["received"] == read[2]["received"], (read[2], read[8])
    assert read[8]["ops"] == read[2]["ops"], (read[2], read[8])


def test_the_last_to_arrive_finds_a_distrusted_group_and_a_failure_for_every_rank(port):
    """Rank 3's group was cut and rank 2's body raised: every rank distrusts the group with the same words, and
    the worker that shows nothing ends with the very error a rank that read every record ends with, having read
    only rank 2's record."""
    boom = {"ename": "ValueError", "evalue": "boom", "traceback": "Traceback ...\nValueError: boom", "short": ""}
    with formed(port, 4, distrusting={3: "its collective was cut"}) as worlds:
        results = run_cell(worlds, first=1, shows={0}, errors={2: boom})
        full = every_record(worlds[0], step_name(results[0]["outcome"].number))
    why = "rank 3: its collective was cut"
    for rank, r in results.items():
        outcome = r["outcome"]
        assert isinstance(outcome, cells.Outcome), outcome
        assert outcome.distrusted == why and worlds[rank].pg.distrusted == [why]
    worker = results[1]["outcome"]
    assert [c is not None for c in worker.captures] == [False, True, True, False]
    assert worker.captures[2] == full[2]
    error = cellerror.error_for(worlds[1], worker)
    assert isinstance(error, CollectiveError)
    assert str(error) == str(cellerror.error_for(worlds[1], cells.Outcome(worker.number, full)))
    assert "rank 2 (h, pid 3) raised ValueError: boom" in str(error)


def test_a_verdict_that_is_not_nbdists_findings_makes_the_rank_read_and_find_for_itself(port):
    """Anyone can write the end's verdict: a text that does not read as findings is not trusted."""
    with formed(port, 3, distrusting={2: "it has no process group yet"}) as worlds:
        world, cell = worlds[0], step_name(1)
        records = [dataclasses.replace(capture(i), pg=worlds[i].pg.state()) for i in range(3)]
        for i, record in enumerate(records):
            world.client.set(world.key(keys.out(cell, i)), json.dumps(record.as_dict()))
        for said in ("", "not json", "[1]", '{"failed": [7]}', '{"distrusted": 3}'):
            captures, found = ending.records(world, cell, verdicts.go(said), records[0], everyone=False)
            assert captures == records
            assert found == ending.Found(distrusted="rank 2: it has no process group yet")
        found = ending.Found(distrusted="why not", failed=(2,))
        captures, _ = ending.records(world, cell, verdicts.decode(verdicts.go(found.encode()).encode()), records[0],
                                     everyone=False)
        assert captures == [records[0], None, records[2]]


def test_findings_travel_in_the_verdict_and_read_back_the_same():
    found = ending.Found(distrusted="rank 1: cut", mismatch="collective #2 (all_reduce) ...", failed=(0, 2))
    opened = verdicts.decode(verdicts.go(found.encode()).encode())
    assert opened is not None and opened.opened
    assert ending.decode(opened, 3) == found
    assert ending.decode(opened, 2) is None  # rank 2 is not in a world of 2
    assert verdicts.go(ending.Found().encode()).encode() == "go:with:{}"
    assert ending.decode(verdicts.GO, 3) is None  # a plain go found nothing: the rank finds for itself


def agree_on_every_rank(worlds: list[World], fps: Callable[[int], dict[str, Any]]) -> dict[int, Any]:
    ended: dict[int, Any] = {}

    def rank(world: World) -> None:
        checker = Checker(world, step_name(1), WAIT, {})
        try:
            checker.agree(fps(world.rank), "0", 1, None)
            ended[world.rank] = None
        except BaseException as exc:  # read by the test
            ended[world.rank] = exc

    threads = [threading.Thread(target=rank, args=(w,), daemon=True) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT)
    assert len(ended) == len(worlds)
    return ended


@pytest.mark.parametrize("differ", [False, True])
def test_the_last_member_to_arrive_compares_the_fingerprints_once_for_every_member(port, counts, differ):
    """One member reads every fingerprint; a difference is every member's CollectiveMismatchError, same words."""
    def fp(rank: int) -> dict[str, Any]:
        shape = [4, 4] if differ and rank == 2 else [4]
        return {"op": "all_reduce", "tensor": {"shape": shape, "dtype": "float32", "device": "cpu"},
                "reduce_op": "SUM"}

    with formed(port, 4) as worlds:
        ended = agree_on_every_rank(worlds, fp)
    assert sum(c.kind("multi_get")[0] for c in counts.every) == 1
    if not differ:
        assert ended == {i: None for i in range(4)}
        return
    texts = {str(e) for e in ended.values()}
    assert all(isinstance(e, CollectiveMismatchError) for e in ended.values()) and len(texts) == 1, ended
    problems = differences({i: {**fp(i), "seq": 1} for i in range(4)})
    assert problems and texts.pop() == (f"collective #1 (all_reduce) of this cell does not match across ranks: "
                                        f"{'; '.join(problems)}. Nothing was sent; fix the cell so every rank issues "
                                        "the same collectives")
