"""The stop button landing inside one named store call of a step, replayed on a real server over real TCP.

Each test is a race that schedule fuzzing found (issue 34, findings F1-F3): the stop lands in nbdist's own
part of a step, between two store calls. Here a real SIGINT is raised on this process's main thread inside
that store call, as the stop button would; the other rank is a second world in a thread. Before the turn
held the stop button in nbdist's part, each of these left the other rank waiting out its --timeout.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from nbdist.cell import cells, turn
from nbdist.cell.turn import Turn
from nbdist.errors import PeerFailedError, StoppedError
from nbdist.session import Session
from nbdist.world import gather, keys
from nbdist.world import verdict as verdicts
from nbdist.world.gather import Gathering
from nbdist.world.records import Arrival, CellStart, Registration
from nbdist.world.store import Server, StoreClient, connect
from nbdist.world.world import World, step_name

RANKS = [Registration(session="s0", rank=0, host="h", pid=1), Registration(session="s1", rank=1, host="h", pid=2)]
BODY = "x = RANK\n"
WAIT = 30.0  # the other rank's --timeout: a replay that regresses waits it out, then fails


class PressInside(StoreClient):
    """A real connection whose one named call is where the stop button lands (a SIGINT on the main thread)."""

    def __init__(self, client: StoreClient, op: str, key_end: str) -> None:
        super().__init__(client.host, client.port, client.raw())
        self.marker, self.op, self.key_end, self.pressed = client.marker, op, key_end, 0

    def _press_if(self, op: str, key: str) -> None:
        if op == self.op and key.endswith(self.key_end) and not self.pressed:
            self.pressed += 1
            signal.raise_signal(signal.SIGINT)

    def add(self, key: str, amount: int) -> int:
        value = super().add(key, amount)
        self._press_if("add", key)
        return value

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        value = super().compare_set(key, expected, desired)
        self._press_if("compare_set", key)
        return value

    def set(self, key: str, value: str) -> None:
        super().set(key, value)
        self._press_if("set", key)


@pytest.fixture
def pair(port):
    server = Server("127.0.0.1", port)
    clients = [connect("127.0.0.1", port) for _ in range(2)]
    try:
        worlds = [World(c, 0, i, 2, RANKS[i], RANKS) for i, c in enumerate(clients)]
        for w in worlds:
            w.last_turn = w.turns.next() - 1  # both just joined
        yield worlds
    finally:
        for c in clients:
            c.close()
        server.stop()


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # read by the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def record(source: str, state: dict[str, Any]) -> Arrival:
    """A rank's record at a cell's meeting, as nbdist.cell.cells builds it."""
    start = CellStart(hashlib.sha256(source.encode()).hexdigest(), source, state, cells.Flags(WAIT).compared())
    return Arrival("cell", "%%collective (start)", start)


def run_cell(world: World, step: int, state: dict[str, Any], rebuilt: list[int]) -> cells.Outcome:
    claimed = Turn()
    claimed.claim(step)
    return cells.run(world, None, BODY, cells.Flags(WAIT), world.client, {}, activate=lambda _: None,
                     rebuild=rebuilt.append, turn=claimed, state=state)


def test_f1_a_stop_before_the_cell_reached_its_meeting_closes_the_step_with_the_body(pair):
    """The stop lands as the cell records itself at its step: a rank late to the same cell fails at once."""
    late, stopped = pair
    n = stopped.turns.next()
    stopped.client = PressInside(stopped.client, "set", f"{step_name(n)}/src/1")
    with pytest.raises(KeyboardInterrupt):
        run_cell(stopped, n, {"ok": True, "gen": 0}, [])
    assert stopped.client.pressed == 1
    m = late.turns.next()
    assert m == n + 1  # the world moved past the closed step
    with pytest.raises(PeerFailedError) as caught:
        turn.refuse_if_peer_did_not_start(late, m, BODY)
    assert "rank 1 (h, pid 2) interrupted its cell" in str(caught.value)


def test_f2_a_stop_just_after_a_rebuild_step_opened_builds_first_then_stops(pair):
    """The stop lands as the last rank opens a rebuild step: it builds with the others, then its cell stops."""
    waiting, stopped = pair
    n = stopped.turns.next()
    unbuilt = {"ok": False, "why": "it has no process group yet"}
    met, box = in_thread(lambda: gather.meet(waiting, n, record(BODY, unbuilt), WAIT))
    # Counted in, not merely recorded: the stopped rank must be the last to arrive, which decides the rebuild.
    while waiting.client.add(waiting.key(f"{step_name(n)}/in/n"), 0) < 1:
        met.join(0.01)
    stopped.client = PressInside(stopped.client, "compare_set", f"{step_name(n)}/in/state")
    rebuilt: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        run_cell(stopped, n, unbuilt, rebuilt)
    met.join(WAIT)
    assert box.get("value", box.get("error")) == verdicts.rebuild("it has no process group yet")
    assert rebuilt == [n]  # the others build too: a build it left would hang them in torch's set-up
    failed = waiting.client.get_json(waiting.key(f"{step_name(n)}/failed"))
    assert failed["rank"] == 1 and failed["kind"] == "interrupted"  # the others' bodies are stopped


def test_f3_a_stop_in_dist_barrier_before_its_wait_closes_its_step(pair):
    """The stop lands as %dist_barrier reads its step: the rank waiting there fails at once, naming it."""
    waiting, stopped = pair
    n = waiting.turns.next()
    met, box = in_thread(lambda: gather.meet(waiting, n, Arrival("barrier", f"%dist_barrier #{n}"), WAIT))
    session = Session(None)
    session.world = stopped
    stopped.client = PressInside(stopped.client, "add", "/turn")
    try:
        with pytest.raises(KeyboardInterrupt):
            session.barrier(WAIT)
    finally:
        session.world = None
    met.join(WAIT)
    assert isinstance(box.get("error"), PeerFailedError), box
    assert "rank 1 (h, pid 2) interrupted its cell" in str(box["error"])
    assert waiting.turns.next() == stopped.turns.next() == n + 1  # both meet at the next step


def test_f4_a_stop_as_a_collective_cell_begins_is_kept_for_the_cell(pair):
    """The stop lands as IPython's pre_run_cell reads the cell's step: it is not raised there (IPython's event
    loop would print it and run the cell on), but kept: the %%collective raises it on entry and closes its step."""
    _, stopped = pair
    session = Session(None)
    session.world, session.watch_client = stopped, stopped.client
    n = stopped.turns.next()
    stopped.client = PressInside(stopped.client, "add", "/turn")
    info = SimpleNamespace(raw_cell="%%collective\n" + BODY)
    try:
        session.before_cell(info)
        assert stopped.client.pressed == 1
        assert session.stops.at_start and session.turn.step == n
        with pytest.raises(KeyboardInterrupt) as caught:
            session.collective(BODY, cells.Flags(WAIT))
        session.after_cell(SimpleNamespace(info=info, error_before_exec=None, error_in_exec=caught.value))
    finally:
        session.world = session.watch_client = None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert stopped.turns.next() == n + 1  # its step, closed: nobody waits for it
    failed = stopped.client.get_json(stopped.key(f"{step_name(n)}/failed"))
    assert failed["kind"] == "interrupted" and failed["unstarted"] == turn.body_digest(BODY)


def test_f5_a_stop_as_a_driving_notebook_publishes_its_cell_leaves_no_hole_in_the_messages(pair):
    """The stop lands as the driving notebook numbers its cell for the followers, before it writes it (the soak
    met it: fault 38 of seed 335, driven, fuzzed): the cell is written all the same, then the stop is taken. A
    hole would have the followers wait for that number for ever, and every later cell of the driver wait out its
    --timeout for them."""
    from nbdist.drive.follow import Drive, Follower
    from nbdist.world import keys, signing

    driver, follower_world = pair
    secret = "a world secret"
    session = Session(None)
    session.world, session.watch_client, session.drive = driver, driver.client, Drive(RANKS[0].session)
    session.secret = lambda: secret  # type: ignore[method-assign]
    with Follower(follower_world, "s1", secret) as follower:
        driver.client = PressInside(driver.client, "add", keys.DRIVE_SEQ)
        n = driver.turns.next()
        try:
            with pytest.raises(KeyboardInterrupt):
                session.collective(BODY, cells.Flags(WAIT))
        finally:
            session.world = session.watch_client = None
        assert driver.client.pressed == 1
        reading, box = in_thread(follower.next)
        reading.join(WAIT)
        assert "value" in box, f"the follower got no message: {box.get('error', 'it still waits for it')}"
        message = box["value"]  # the cell came through: nothing of the driver's is missing
        assert (message.kind, message.source, message.number) == ("collective", BODY, n)
        assert signing.verify(signing.key_from(secret), json.loads(follower_world.client.get(
            follower_world.key(keys.drive(message.seq)))), round_=0, seq=message.seq,
            driver={"rank": 0, "session": "s0"}) is None


class RaiseInside(PressInside):
    """A real connection whose one named call is where a watcher's stop lands (what ``Stopper`` raises there)."""

    def __init__(self, client: StoreClient, op: str, key_end: str, stop: BaseException) -> None:
        super().__init__(client, op, key_end)
        self.stop = stop

    def _press_if(self, op: str, key: str) -> None:
        if op == self.op and key.endswith(self.key_end) and not self.pressed:
            self.pressed += 1
            raise self.stop


@pytest.mark.parametrize("built", [True, False], ids=["go", "rebuild"])
def test_f6_a_stop_of_every_rank_just_after_a_cell_opened_stays_that_stop_not_the_stop_button(pair, built):
    """A stop that is not the stop button (the driver's stop, sent to a follower by its watcher; %dist_stop;
    --max-time) lands as the last rank opens the cell's start: the cell ends with that stop, as it would in the
    body. The soak met it (seed 336, driven, fuzzed): the follower took it for its own stop button, a plain
    KeyboardInterrupt, stopped following, and every later cell of the driver waited out its --timeout for it."""
    waiting, stopped = pair
    n = stopped.turns.next()
    state = {"ok": True, "gen": 0} if built else {"ok": False, "why": "it has no process group yet"}
    met, box = in_thread(lambda: gather.meet(waiting, n, record(BODY, state), WAIT))
    while waiting.client.add(waiting.key(f"{step_name(n)}/in/n"), 0) < 1:
        met.join(0.01)
    stop = StoppedError("rank 0 (h, pid 1) interrupted its cell")
    stopped.client = RaiseInside(stopped.client, "compare_set", f"{step_name(n)}/in/state", stop)
    rebuilt: list[int] = []
    with pytest.raises(KeyboardInterrupt) as caught:
        run_cell(stopped, n, state, rebuilt)
    assert stopped.client.pressed == 1
    assert type(caught.value) is StoppedError and str(caught.value) == str(stop)
    met.join(WAIT)
    assert box.get("value", box.get("error")) == (verdicts.GO if built else
                                                  verdicts.rebuild("it has no process group yet"))
    assert rebuilt == ([] if built else [n])  # a rebuild every rank started is finished first


def test_f7_a_stop_of_every_rank_just_after_a_collectives_comparison_opened_is_raised_as_it_came(pair):
    """The same stop landing as the last rank opens a collective's comparison in the body (a barrier of no step):
    the body raises that stop, as it would a moment later, not a stand-in the capture would take for the stop
    button (only a step's meeting keeps such a stop for what follows: ``Gathering.late_stop``). The soak met it
    (seed 336, driven, fuzzed, a stop of every rank): a follower whose own record said "interrupted" stopped
    following, and every later cell of its driver waited for it."""
    waiting, stopped = pair
    base = keys.compared(step_name(stopped.turns.next()), "0", 1)
    compared = Gathering(base, "collective #1 (all_reduce) of this cell", WAIT)
    met, box = in_thread(lambda: gather.barrier(waiting, compared))
    while waiting.client.add(waiting.key(keys.arrivals(base)), 0) < 1:
        met.join(0.01)
    stop = StoppedError("stopped by nbdist stop in a terminal")
    stopped.client = RaiseInside(stopped.client, "compare_set", f"{base}/state", stop)
    with pytest.raises(KeyboardInterrupt) as caught:
        gather.barrier(stopped, compared)
    assert type(caught.value) is StoppedError and str(caught.value) == str(stop)
    met.join(WAIT)
    assert box.get("value", box.get("error")) == verdicts.GO  # the others go on: it opened
