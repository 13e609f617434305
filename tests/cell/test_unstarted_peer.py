"""A rank late to a cell that another rank could not start (its step already closed, the world moved on): when it
fails at once, and when it still meets the others. Real server, real TCP, two worlds in one process."""

from __future__ import annotations

import pytest

from nbdist.cell import turn
from nbdist.errors import PeerFailedError
from nbdist.world.world import step_name

BODY = "x = RANK\n"


@pytest.fixture
def pair(two_worlds):
    return two_worlds  # (rank 0, rank 1), both just joined


def test_the_late_rank_fails_with_the_peers_reason_and_takes_no_step(pair):
    late, peer = pair
    turn.abandon(peer, "could not start its cell (UsageError: unrecognized arguments: --timeuot)", body=BODY)
    n = late.turns.next()
    assert n == 2  # step 1 went by
    with pytest.raises(PeerFailedError) as caught:
        turn.refuse_if_peer_did_not_start(late, n, " x = RANK ")  # the body as its magic gets it
    assert "%%collective #1 (start): rank 1 (h, pid 2) could not start its cell (UsageError" in str(caught.value)
    assert late.turns.next() == 2  # no step taken: the next cell of every rank meets at step 2


def test_the_late_rank_is_told_once_and_its_next_run_meets_the_peer(pair):
    """Run again at once, before the stopped rank runs its cell again, the late rank's cell goes to meet it at the
    next step instead of failing again with the old reason (the explorer found this with 3 ranks: rebuild, seed 36,
    where the stopped rank then waited out its --timeout for it)."""
    late, peer = pair
    turn.abandon(peer, "interrupted its cell", interrupted=True, body=BODY)
    n = late.turns.next()
    with pytest.raises(PeerFailedError):
        turn.refuse_if_peer_did_not_start(late, n, BODY)
    turn.refuse_if_peer_did_not_start(late, late.turns.next(), BODY)  # does not raise: it goes on to meet at n
    assert late.turns.next() == n


@pytest.mark.parametrize("case", ["another cell", "its own", "peer waits at n", "it met that step", "no body"])
def test_otherwise_it_goes_to_meet_the_others(pair, case):
    late, peer = pair
    closer = late if case == "its own" else peer
    turn.abandon(closer, "interrupted its cell", interrupted=True, body=None if case == "no body" else BODY)
    n = late.turns.next()
    if case == "peer waits at n":  # the peer ran the cell again and is waiting at the next step
        peer.client.add(peer.key(f"{step_name(n)}/in/n"), 1)
    if case == "it met that step":
        late.last_turn = n - 1
    source = "y = RANK\n" if case == "another cell" else BODY
    turn.refuse_if_peer_did_not_start(late, n, source)  # does not raise


def test_a_cell_starts_at_the_step_its_pre_run_cell_claimed_and_is_published_whole_before_a_stop(pair):
    """Turn.starts: the step claimed as the cell began (the world may have moved since), published to followers with
    the stop button held: a press meanwhile is taken once the cell is out, not in the middle."""
    late, _ = pair
    t = turn.Turn()
    t.cell_began(late, "%%collective\nx = 1\n")
    claimed = t.step
    published: list[int] = []

    def publish(step: int) -> None:
        t.stops.press()  # the stop button, while the cell goes out
        published.append(step)

    late.turns.take(late.turns.next())  # another rank's step went by after pre_run_cell claimed this one
    assert late.turns.next() == claimed + 1
    with pytest.raises(KeyboardInterrupt):
        t.starts(late, BODY, publish)
    assert published == [claimed] and t.step == claimed


def test_a_cell_whose_peer_could_not_start_it_fails_before_it_is_published(pair):
    late, peer = pair
    turn.abandon(peer, "interrupted its cell", interrupted=True, body=BODY)
    t, published = turn.Turn(), []
    with pytest.raises(PeerFailedError):
        t.starts(late, BODY, published.append)
    assert published == [] and t.phase is turn.Phase.DONE  # nothing of its own to close
