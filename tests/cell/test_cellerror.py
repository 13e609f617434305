"""The error a %%collective ends with on this rank (nbdist.cell.cellerror), as a table: what the ranks' records
and the cell's reason say, and what this rank raises once its table is shown. Pure: no store, no kernel."""

from __future__ import annotations

from typing import Any

import pytest

from nbdist.cell.cellerror import error_for
from nbdist.cell.cells import Outcome
from nbdist.errors import (
    CollectiveError,
    CollectiveMismatchError,
    MaxTimeError,
    PeerFailedError,
    PeerLostError,
    StoppedError,
    StoreConnectionError,
    WaitTimeout,
)
from nbdist.world.capture_record import Capture
from nbdist.world.records import WORLD, Failure, Registration
from nbdist.world.world import World

RANKS = [Registration(session=f"s{i}", rank=i, host="h", pid=i + 1) for i in range(3)]
ME = 1  # this rank


def error(ename: str, evalue: str = "bad", **more: Any) -> dict[str, Any]:
    return {"ename": ename, "evalue": evalue, "traceback": f"{ename}: {evalue}", **more}


def capture(err: dict[str, Any] | None = None) -> Capture:
    return Capture.from_dict({"outputs": [], "result": None, "error": err, "wall": 0.0})


STOPPED = error("KeyboardInterrupt", "", interrupted=True)
CUT = error("DistBackendError", "Connection closed by peer", consequence=True)


@pytest.mark.parametrize(("mine", "others", "reason", "mismatch", "expected"), [
    # Nothing failed anywhere.
    (None, {}, None, None, None),
    # This rank's stop button, even when another rank failed first; q in its debugger.
    (STOPPED, {0: error("ValueError")}, Failure(0, "error", "rank 0 (h, pid 1) raised ValueError: bad"), None,
     (KeyboardInterrupt, "")),
    (error("BdbQuit", "", interrupted=True), {}, None, None,
     (StoppedError, "rank 1 (h, pid 2) quit its debugger (q): the cell ended on every rank")),
    # Its own error comes before the reason another rank gave.
    (error("ValueError", "mine"), {0: error("KeyError")}, Failure(0, "error", "rank 0 raised"), None,
     (CollectiveError, "rank 1 (h, pid 2) raised ValueError: mine")),
    (error("MaxTimeError", "--max-time 1 ran out"), {}, None, None, (MaxTimeError, "--max-time 1 ran out")),
    # Cut short by another rank: its nbdist error, the same on every rank; else what cut it, by kind.
    (CUT, {0: error("MaxTimeError", "--max-time 2 ran out")}, Failure(0, "max-time", "m"), None,
     (MaxTimeError, "--max-time 2 ran out")),
    (None, {0: error("ValueError")}, Failure(0, "error", "rank 0 (h, pid 1) raised ValueError: bad"), None,
     (PeerFailedError, "rank 0 (h, pid 1) raised ValueError: bad (this rank's cell was stopped; its column shows")),
    (CUT, {}, Failure(WORLD, "lost", "rank 2 (h, pid 3) is gone"), None,
     (PeerLostError, "rank 2 (h, pid 3) is gone (this rank's cell was stopped")),
    (None, {}, Failure(WORLD, "server", "the rendezvous server went away"), None,
     (StoreConnectionError, "the rendezvous server went away (this rank")),
    # Its own error that followed from its own stop: the reason is its own.
    (CUT, {}, Failure(ME, "error", "rank 1 raised"), None,
     (CollectiveError, "rank 1 (h, pid 2) raised DistBackendError")),
    # Collectives that ran but did not match, when nothing else failed.
    (None, {}, None, "all_reduce #1 does not match", (CollectiveMismatchError, "all_reduce #1 does not match")),
    # Another rank's error alone: a stop, nbdist's own, or the user's, named.
    (None, {2: STOPPED}, None, None, (PeerFailedError, "rank 2 (h, pid 3) interrupted its cell")),
    (None, {0: error("WaitTimeout", "waited 5 s")}, None, None, (WaitTimeout, "waited 5 s")),
    (None, {0: error("ValueError"), 2: error("KeyError", "'x'")}, None, None,
     (CollectiveError, "rank 0 (h, pid 1) raised ValueError: bad; rank 2 (h, pid 3) raised KeyError: 'x' (traceback")),
])
def test_the_error_a_cell_ends_with_is_the_first_rule_that_finds_one(mine, others, reason, mismatch, expected):
    world = World(None, 0, ME, len(RANKS), RANKS[ME], RANKS)  # type: ignore[arg-type]  # describe reads no store
    captures = [capture(others.get(i)) for i in range(len(RANKS))]
    captures[ME] = capture(mine)
    got = error_for(world, Outcome(1, captures, reason, mismatch=mismatch))
    if expected is None:
        assert got is None
        return
    cls, text = expected
    assert isinstance(got, cls) and str(got).startswith(text), repr(got)


def test_an_error_whose_column_show_left_out_carries_its_traceback_as_a_column_shows_it():
    """--show 0 on rank 1: its own error, said under the table, carries its traceback, with the cell's frame as
    ``cell line 2`` (not ipykernel's temporary file, whose name holds the pid) and nbdist's own frames hidden."""
    full = ('Traceback (most recent call last):\n'
            '  File "/tmp/ipykernel_4242/1234567.py", line 2, in <module>\n    1 / 0\n'
            'ZeroDivisionError: division by zero\n')
    short = full.replace("Traceback (most recent call last)", "Traceback (nbdist's own frames hidden; 1 hidden)")
    world = World(None, 0, ME, len(RANKS), RANKS[ME], RANKS)  # type: ignore[arg-type]  # describe reads no store
    captures = [capture() for _ in RANKS]
    captures[ME] = capture(error("ZeroDivisionError", "division by zero", traceback=full, short=short))
    got = error_for(world, Outcome(1, captures, None, show=(0,)))
    assert isinstance(got, CollectiveError) and str(got).startswith("rank 1 (h, pid 2) raised ZeroDivisionError")
    assert "cell line 2" in got.traceback_text and "ipykernel_" not in got.traceback_text, got.traceback_text
    assert "nbdist's own frames hidden" in got.traceback_text, got.traceback_text
    shown = error_for(world, Outcome(1, captures, None, show=(0, 1)))
    assert isinstance(shown, CollectiveError) and not shown.traceback_text  # its column shows it
