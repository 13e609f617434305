"""A breakpoint on a driven rank, relayed through a real TCPStore to the driving notebook, every part signed.

This process stands for both sides: a thread is the driven rank 1, stopped in the debugger at a breakpoint
of its body; the main thread is the driving notebook's rank 0, answering while it waits in nbdist
(:meth:`Breakpoints.serve`, as its waits call it).
"""

from __future__ import annotations

import io
import re
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from nbdist.debug import breakpoints
from nbdist.world import keys, signing
from nbdist.world.heartbeat import Heartbeat
from nbdist.world.records import Registration
from nbdist.world.store import StoreClient
from nbdist.world.world import World

TOKEN = "bp-test-token"
KEY = signing.key_from(TOKEN)
ROUND = 3
CELL = keys.step(12)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def world_of_two(client: StoreClient, rank: int) -> World:
    ranks = [Registration(session=f"s{i}", rank=i, host=socket.gethostname(), pid=100 + i) for i in range(2)]
    return World(client, ROUND, rank, 2, ranks[rank], ranks)


class RankOne(threading.Thread):
    """Driven rank 1's body: ``x = 41``, a breakpoint, then ``y = x + 1``; ``y`` is what it ended with."""

    def __init__(self, client: StoreClient, key: bytes = KEY) -> None:
        super().__init__(daemon=True)
        self.world = world_of_two(client.clone(), 1)
        self.here = breakpoints.Here(self.world, CELL, "%%collective #12", driven=True, key=lambda: key,
                                     out=io.StringIO(), driver=0)
        self.y: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            x = 41
            self.here.stop(sys._getframe())  # what breakpoint() does in the body
            y = x + 1
            self.y = y
        except BaseException as exc:  # noqa: BLE001 (q ends the body with BdbQuit: the test reads it)
            self.error = exc


def answer_from_rank_zero(client: StoreClient, lines: list[str], rank_one: RankOne, key: bytes = KEY,
                          read_line: Callable[[str], str] | None = None) -> tuple[str, list[str]]:
    """Rank 0 waits (serving) until rank 1's body ends, typing ``lines``; what it showed, and its prompts."""
    shown = io.StringIO()
    prompts: list[str] = []

    def typed(prompt: str) -> str:
        prompts.append(prompt)
        return lines.pop(0)

    bp = breakpoints.Breakpoints(lambda: TOKEN if key == KEY else "another-token", lambda: 300.0, out=shown,
                                 read_line=read_line or typed)
    world = world_of_two(client, 0)
    beat = Heartbeat(client.clone(), "s0", 0)  # rank 0 lives: rank 1's debugger does not give up on it
    try:
        with bp.answering(world, CELL):
            assert world.attend is not None, "a driving notebook answers while it waits"
            rank_one.start()
            deadline = time.monotonic() + 60
            while rank_one.is_alive() and time.monotonic() < deadline:
                world.attend()
                time.sleep(0.02)
        assert world.attend is None
    finally:
        beat.stop()
    rank_one.join(10)
    return ANSI.sub("", shown.getvalue()), prompts


@pytest.mark.timeout(120)
def test_rank_1s_breakpoint_is_answered_from_rank_0_with_rank_1s_values_and_it_goes_on(client):
    rank_one = RankOne(client)
    shown, prompts = answer_from_rank_zero(client, ["p x", "n", "p y", "c"], rank_one)
    assert rank_one.error is None and rank_one.y == 42, rank_one.error
    assert re.search(r"nbdist: rank 1 \(.+\) stopped at a breakpoint", shown), shown
    assert len(prompts) == 4 and all(re.fullmatch(r"rank 1 \(.+\) ipdb> ", p) for p in prompts), prompts
    assert "\n41\n" in shown and "\n42\n" in shown, shown  # rank 1's x, then its y after n
    assert re.search(r"nbdist: rank 1 \(.+\) goes on", shown), shown
    # The relay's records are read once and deleted; the breakpoint's own record stays, counted.
    assert client.add(keys.in_round(ROUND, keys.BP_ASKS), 0) == 1
    assert client.get_if(keys.in_round(ROUND, keys.pdb_out(1, 0, "bp"))) is None


@pytest.mark.timeout(120)
def test_q_at_rank_1s_prompt_ends_its_body_with_bdbquit_and_says_the_cell_ends(client):
    rank_one = RankOne(client)
    shown, prompts = answer_from_rank_zero(client, ["q"], rank_one)
    assert type(rank_one.error).__name__ == "BdbQuit", rank_one.error  # the cell ends as at the stop button
    assert rank_one.y is None
    assert re.search(r"rank 1 \(.+\) quit its debugger: the cell ends on every rank", shown), shown
    assert sys.gettrace() is None


class Garbage:
    """An object whose weakref's callback runs as it dies: a Python call on the body's thread that the body did
    not make (a garbage collection runs such callbacks wherever it lands)."""


class RankOneWithACallback(RankOne):
    """Rank 1's body, where a weakref's callback runs between the breakpoint and the body's next line (as the frame
    that stopped returns): the full suite met the callback's frame taken for the first stop, once."""

    def __init__(self, client: StoreClient) -> None:
        super().__init__(client)
        self.refs: list[Any] = []
        self.called = 0

    def run(self) -> None:
        try:
            x = 41
            self._stop_as_garbage_goes(sys._getframe())
            y = x + 1
            self.y = y
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def _stop_as_garbage_goes(self, frame: Any) -> None:
        garbage = Garbage()
        self.refs.append(weakref.ref(garbage, self._collected))  # its callback runs as this frame ends
        self.here.stop(frame)

    def _collected(self, ref: Any) -> None:
        self.called += 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("typed", ["q", "p x\nc"])
def test_the_debugger_stops_first_at_the_bodys_next_line_not_in_a_call_before_it(client, typed):
    rank_one = RankOneWithACallback(client)
    shown, prompts = answer_from_rank_zero(client, typed.split("\n"), rank_one)
    assert rank_one.called == 1  # the callback ran, untraced
    assert "_collected" not in shown, shown  # no stop in the callback
    if typed == "q":
        assert type(rank_one.error).__name__ == "BdbQuit" and rank_one.y is None, rank_one.error
    else:
        assert rank_one.error is None and rank_one.y == 42 and "\n41\n" in shown, (rank_one.error, shown)
    assert sys.gettrace() is None


@pytest.mark.timeout(120)
def test_a_driving_notebook_that_takes_no_input_skips_rank_1s_breakpoint_and_says_so(client):
    from IPython.core.error import StdinNotImplementedError

    def no_input(prompt: str) -> str:
        raise StdinNotImplementedError("raw_input was called, but this frontend does not support input requests.")

    rank_one = RankOne(client)
    shown, _ = answer_from_rank_zero(client, [], rank_one, read_line=no_input)
    assert rank_one.error is None and rank_one.y == 42, rank_one.error
    assert re.search(r"front end takes no input: rank 1 \(.+\)'s breakpoint is skipped", shown), shown


@pytest.mark.timeout(120)
def test_a_breakpoint_record_sealed_with_another_key_is_not_answered(client, caplog):
    rank_one = RankOne(client, key=signing.key_from("not-this-world"))
    rank_one.here._gone = lambda: (lambda: "the test is over")  # type: ignore[method-assign]  # quits at its first look
    with caplog.at_level("WARNING"):
        shown, prompts = answer_from_rank_zero(client, [], rank_one)
    assert prompts == [] and "stopped at a breakpoint" not in shown, shown
    assert "did not verify" in caplog.text


def test_a_cell_that_calls_a_breakpoint_is_known_by_its_source():
    assert breakpoints.calls_breakpoint("x = 1\nbreakpoint()\n")
    assert breakpoints.calls_breakpoint("import pdb; pdb.set_trace()")
    assert breakpoints.calls_breakpoint("nbdist.breakpoint(ranks='1,3')")
    assert not breakpoints.calls_breakpoint("print('no breakpoint here')\nset_traces = 3")


def test_nbdist_breakpoint_outside_a_body_stops_only_the_listed_ranks(monkeypatch):
    stopped: list[Any] = []
    monkeypatch.setattr(breakpoints.pdb, "Pdb", lambda: type("P", (), {"set_trace": stopped.append})())
    monkeypatch.setenv("RANK", "2")
    breakpoints.breakpoint(ranks="0,1")
    breakpoints.breakpoint(ranks=[3])
    assert stopped == []
    breakpoints.breakpoint(ranks="1-2")
    assert len(stopped) == 1 and stopped[0].f_code.co_name.startswith("test_nbdist_breakpoint")
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    breakpoints.breakpoint()
    assert len(stopped) == 1
