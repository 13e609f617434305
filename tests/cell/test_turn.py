"""One rank's turn at a step (nbdist.cell.turn) and the meetings' verdicts (nbdist.world.verdict): pure decisions (the
stop state: tests/cell/test_stops.py)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from nbdist.cell.turn import (
    CellEnded,
    Closing,
    LateStart,
    Leaving,
    Phase,
    body_digest,
    closing,
    late_refusal,
    left_early,
    takes_stop,
)
from nbdist.errors import DriveError
from nbdist.world import verdict as verdicts
from nbdist.world.records import Failure
from nbdist.world.verdict import Kind, Verdict


@pytest.mark.parametrize(("text", "kind", "why"), [
    ("go", Kind.GO, ""),
    ('go:with:{"failed":[1]}', Kind.GO, '{"failed":[1]}'),  # what the last to arrive found (nbdist.cell.ending)
    ("go:rebuild:rank 1: it has no process group yet", Kind.REBUILD, "rank 1: it has no process group yet"),
    ("go:rebuild:", Kind.REBUILD, ""),
    ("refused:the ranks entered this %%collective with different code", Kind.REFUSED,
     "the ranks entered this %%collective with different code"),
    ("rank 1 (h, pid 2) interrupted its cell", Kind.CLOSED, "rank 1 (h, pid 2) interrupted its cell"),
    ("gone", Kind.CLOSED, "gone"),  # only "go" and "go:…" open; anything else a rank wrote closes
])
def test_a_state_as_the_store_holds_it_reads_as_one_verdict_and_writes_back_the_same(text, kind, why):
    decided = verdicts.decode(text)
    assert decided == Verdict(kind, why)
    assert decided.encode() == text
    assert decided.opened is (kind in (Kind.GO, Kind.REBUILD))
    assert decided.rebuild == (why if kind is Kind.REBUILD else None)


def test_a_meeting_closed_by_a_rank_that_found_another_gone_reads_as_that_finding_for_every_rank():
    """Issue 50: in a large world only some ranks read a given rank's heartbeat (nbdist.world.liveness.looked_at);
    the one that finds it gone closes the meeting with what it found, and every rank raises that PeerLostError."""
    found = "rank 2 (h, pid 9) is gone: its kernel exited or was killed. Once its notebook runs ..."
    decided = verdicts.decode(verdicts.lost(found).encode())
    assert decided == verdicts.lost(found) and decided.kind is Kind.CLOSED and decided.lost and not decided.opened
    assert decided.encode() == "lost:" + found and decided.said == found and decided.why == found
    assert verdicts.decode("rank 1 (h, pid 2) interrupted its cell").said == "rank 1 (h, pid 2) interrupted its cell"


def test_an_unset_state_is_undecided_and_any_go_form_opens():
    assert verdicts.decode(None) is None and verdicts.decode("") is None
    assert verdicts.decode("go:a later form") == verdicts.GO


@pytest.mark.parametrize(("phase", "expected"), [
    (Phase.IDLE, None),
    (Phase.CLAIMED, Closing(unstarted=True)),  # the typo, and the stop before the meeting (finding F1)
    (Phase.ARRIVING, Closing(unstarted=True)),
    (Phase.MEETING, Closing(unstarted=False)),  # counted in, it gave up waiting: a late rank meets at the next step
    (Phase.BUILDING, Closing(unstarted=False)),
    (Phase.BODY, Closing(unstarted=False)),
    (Phase.ENDING, Closing(unstarted=False)),
    (Phase.DONE, None),
])
def test_what_a_rank_leaving_its_step_writes_depends_on_its_phase_alone(phase, expected):
    assert closing(phase) == expected


def test_a_held_stop_is_taken_everywhere_but_inside_a_rebuild_and_at_the_body_s_end():
    taken = {phase for phase in Phase if takes_stop(phase)}
    assert taken == {Phase.IDLE, Phase.CLAIMED, Phase.ARRIVING, Phase.MEETING, Phase.BODY}


@pytest.mark.parametrize(("raw", "error", "expected"), [
    # Not a %%collective, or no error: the turn has nothing to tell.
    ("x = 1", KeyboardInterrupt(), None),
    ("%%collective\nx = 1", None, None),
    # Another notebook drives: the cell never had a turn of its own.
    ("%%collective\nx = 1", DriveError("rank 0 drives"), None),
    # The stop button, or the magic's flags, before nbdist's code: the step is left with the cell's body.
    ("  %%collective --timeout 5\nx = 1\ny = 2", KeyboardInterrupt(),
     Leaving("interrupted its cell", True, "x = 1\ny = 2")),
    ("%%collective --tmeout 5\nx = 1", UsageError("unrecognized arguments: --tmeout 5"),
     Leaving("could not start its cell (UsageError: unrecognized arguments: --tmeout 5)", False, "x = 1")),
])
def test_a_collective_that_ended_with_an_error_leaves_its_step_with_its_reason(raw, error, expected):
    assert left_early(CellEnded.of(raw, error)) == expected


def _unstarted(rank: int, body: str) -> Failure:
    return Failure(rank, "interrupted", f"rank {rank} (h, pid 9) interrupted its cell", body_digest(body))


@pytest.mark.parametrize(("failure", "waits", "refused"), [
    (_unstarted(1, "x = 1"), False, True),  # the peer's same cell never started, nobody at step n: refused
    (_unstarted(1, "x = 1"), True, False),  # the peer ran it again and waits at n: meet it there
    (_unstarted(1, "y = 2"), False, False),  # another cell's: this one goes on
    (_unstarted(0, "x = 1"), False, False),  # its own
    (Failure(1, "error", "rank 1 raised", None), False, False),  # a cell that started, then failed
    (None, False, False),  # no failure at step n - 1
])
def test_a_rank_late_to_a_cell_is_refused_at_its_start_only_for_a_peers_same_unstarted_cell(failure, waits, refused):
    got = late_refusal(LateStart(failure, waits), me=0, digest=body_digest(" x = 1\n"))  # the body as its magic gets it
    assert got == (failure if refused else None)
