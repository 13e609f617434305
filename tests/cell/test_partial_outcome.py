"""A cell cut short carries what the ranks produced so far on its exception, through one declared pair of functions
(issue 34, item 2): the stop button's own KeyboardInterrupt included."""

from __future__ import annotations

from nbdist.cell.cells import Outcome, cut_short, partial_of
from nbdist.errors import StoreConnectionError
from nbdist.world.capture_record import Capture


def test_an_exception_carries_the_partial_outcome_and_passes_it_on():
    outcome = Outcome(number=3, captures=[Capture(outputs=[], result=None, error=None, wall=0.0, rank=0), None])
    stop = KeyboardInterrupt()
    assert partial_of(stop) is None
    cut_short(stop, outcome)
    assert partial_of(stop) is outcome
    lost = StoreConnectionError("lost contact with rank 0")
    cut_short(lost, partial_of(stop))  # the session's own error for a lost server keeps it
    assert partial_of(lost) is outcome


def test_an_exception_that_carries_none_reads_as_none():
    error = RuntimeError("x")
    cut_short(error, None)
    assert partial_of(error) is None
