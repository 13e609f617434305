"""One driver for every kind of step (nbdist.cell.step): its decisions as a table, the turn's diagram enforced, and
the driver on a real server over real TCP, two worlds in one process."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import nbdist
from nbdist.cell import step as steps
from nbdist.cell import turn
from nbdist.cell.step import BARRIER, CELL, REBUILD, Action, Claim, Plan, next_action
from nbdist.cell.turn import EDGES, Ending, Meeting, Phase, Turn
from nbdist.errors import PeerFailedError, TurnError
from nbdist.world import keys
from nbdist.world import verdict as verdicts
from nbdist.world.gather import Gathering
from nbdist.world.records import CellStart
from nbdist.world.verdict import Verdict
from nbdist.world.world import World, step_name

from .test_turn_replays import in_thread  # a rank in a thread, its return or raise boxed

WAIT = 30.0  # the other rank's wait: a driver that left it waiting would run it out, and the test fail
GO, REBUILT = verdicts.GO, verdicts.rebuild("rank 1: it has no process group yet")


@pytest.mark.parametrize(("phase", "shape", "opened", "action"), [
    # Claimed: every kind of step meets first.
    (Phase.CLAIMED, BARRIER, None, Action.MEET),
    (Phase.CLAIMED, REBUILD, None, Action.MEET),
    (Phase.CLAIMED, CELL, None, Action.MEET),
    # Met: a barrier is passed, a rebuild builds, a cell builds only when the last to arrive said so.
    (Phase.MEETING, BARRIER, GO, Action.FINISH),
    (Phase.MEETING, BARRIER, REBUILT, Action.FINISH),  # a barrier never builds, whatever the store says
    (Phase.MEETING, REBUILD, GO, Action.BUILD),
    (Phase.MEETING, CELL, GO, Action.BODY),
    (Phase.MEETING, CELL, REBUILT, Action.BUILD),
    # Built: a rebuild is over, a cell runs its body; then it meets at its end; its end met, it is over.
    (Phase.BUILDING, REBUILD, GO, Action.FINISH),
    (Phase.BUILDING, CELL, REBUILT, Action.BODY),
    (Phase.BODY, CELL, GO, Action.END),
    (Phase.DONE, CELL, GO, Action.FINISH),
    (Phase.DONE, BARRIER, None, Action.FINISH),  # refused at its meeting: every rank alike, nothing more to do
])
def test_the_next_action_depends_on_the_phase_the_kind_of_step_and_its_meetings_verdict(phase, shape, opened, action):
    assert next_action(phase, shape, opened) is action


@pytest.mark.parametrize(("phase", "opened"), [
    (Phase.IDLE, None),  # never claimed
    (Phase.ARRIVING, None),  # a meeting left without being counted in raised, and never comes back here
    (Phase.MEETING, None),  # met, yet no verdict
    (Phase.ENDING, GO),  # the end's meeting ends the turn or raises
])
def test_a_phase_the_driver_never_leaves_a_turn_in_has_no_action(phase, opened):
    with pytest.raises(TurnError, match=f"no action for a turn {phase.value}.*a bug in nbdist"):
        next_action(phase, CELL, opened)


def test_the_turn_makes_every_move_of_its_diagram_and_refuses_the_others():
    for start, to in EDGES:
        t = Turn()
        t.phase, t.step = start, 3
        t.enter(to)  # nothing held: no stop to take
        assert t.phase is to
    refused = [(a, b) for a in Phase for b in Phase if (a, b) not in EDGES]
    assert (Phase.CLAIMED, Phase.BODY) in refused and (Phase.BODY, Phase.MEETING) in refused
    for start, to in refused:
        t = Turn()
        t.phase, t.step = start, 3
        with pytest.raises(TurnError) as caught:
            t.enter(to)
        assert str(caught.value) == (f"nbdist's turn cannot go from {start.value} to {to.value} (step #3): this is a "
                                     "bug in nbdist, please report it")
        assert t.phase is start  # nothing moved


def test_a_new_cell_begins_a_turn_from_any_phase_and_a_follower_claims_its_next_step_after_the_last():
    t = Turn()
    t.claim(4)
    t.done()
    t.claim(5)  # a follower's next step, in the same %dist_follow cell
    assert (t.phase, t.step) == (Phase.CLAIMED, 5)
    t.phase = Phase.BODY
    t.begin()
    assert (t.phase, t.step) == (Phase.IDLE, None)


def test_a_collective_inside_another_collectives_body_is_refused_with_what_to_do_instead():
    t = Turn()
    t.phase, t.step = Phase.BODY, 4
    with pytest.raises(TurnError) as caught:
        t.starts(None, "x = 1\n", lambda n: None)  # type: ignore[arg-type]  # refused before it reads the world
    assert str(caught.value) == ("a %%collective cannot run inside another %%collective's body (step #4, body): run "
                                 "it as a cell of its own, or as plain code in the body")
    assert (t.phase, t.step) == (Phase.BODY, 4)  # the running cell's turn is left as it was


@pytest.fixture
def pair(two_worlds):
    return two_worlds  # (rank 0, rank 1), both just joined


class Work:
    """A step's body and end as a cell has them, recording what the driver called, in its order."""

    def __init__(self, world: World, body: Any = None) -> None:
        self.world, self.calls, self.run = world, list[str](), body

    def body(self, opened: Verdict) -> None:
        self.calls.append(f"body {opened.encode()}")
        if self.run is not None:
            self.run()

    def end(self) -> Ending:
        self.calls.append("end")
        cell = step_name(self.world.last_turn or 0)
        return Ending(Gathering(keys.ending(cell), "the end", WAIT, verdict=lambda: verdicts.go("found")))

    def ended(self, opened: Verdict) -> str:
        self.calls.append(f"ended {opened.encode()}")
        return "outcome"


def meeting(kind: str) -> Any:
    return lambda n: Meeting(kind, f"{kind} #{n}", WAIT)


def test_every_kind_of_step_runs_through_one_driver_in_its_phases(pair):
    """A barrier, then a plain cell's rebuild, then a cell that the last to arrive says must rebuild first: both ranks
    go through each, and the cell's work runs in its order (body, end, what it returns); the body's collective is
    compared across the ranks through the turn, in its body."""
    works, built, compared = [Work(w) for w in pair], list[tuple[int, int]](), list[Verdict]()

    def rank(world: World, work: Work) -> list[Any]:
        t = Turn()
        work.run = lambda: compared.append(t.compare(world, Gathering(
            keys.compared(step_name(t.step or 0), "0", 1), "collective #1 (all_reduce) of this cell", WAIT)))
        done = [steps.drive(Turn(), world, Plan(BARRIER, meeting("barrier"), turn.BARRIER, Claim()))]
        done.append(steps.drive(Turn(), world, Plan(REBUILD, meeting("rebuild"), None, Claim(),
                                                    build=lambda n: built.append((world.rank, n)))))
        start = CellStart("h", "x = 1\n", {"ok": True, "gen": 0}, {})
        cell = Plan(CELL, lambda n: Meeting("cell", f"cell #{n}", WAIT, start, verdict=lambda _: REBUILT), "x = 1\n",
                    Claim(), build=lambda n: built.append((world.rank, n)), work=work)
        done.append(steps.drive(t, world, cell))
        return done

    threads = [in_thread(lambda w=w, k=k: rank(w, k)) for w, k in zip(pair, works, strict=True)]
    for thread, _ in threads:
        thread.join(2 * WAIT)
    assert [box.get("value", box.get("error")) for _, box in threads] == [[None, None, "outcome"]] * 2
    assert sorted(built) == [(0, 2), (0, 3), (1, 2), (1, 3)]  # the rebuild's step, then the cell's
    assert all(w.calls == [f"body {REBUILT.encode()}", "end", "ended go:with:found"] for w in works)
    assert compared == [verdicts.GO] * 2


@pytest.mark.parametrize("phase", [p for p in Phase if p is not Phase.BODY])
def test_a_collective_is_compared_across_the_ranks_only_in_a_cells_body(phase):
    t = Turn()
    t.phase, t.step = phase, 5
    with pytest.raises(TurnError) as caught:
        t.compare(None, Gathering("c", "collective #1 (all_reduce) of this cell", WAIT))  # type: ignore[arg-type]
    assert str(caught.value) == (f"nbdist compared a collective across the ranks outside a cell's body (step #5, "
                                 f"{phase.value}): this is a bug in nbdist, please report it")


def test_a_move_off_the_diagram_inside_a_step_closes_it_and_the_other_rank_is_told_at_once(pair):
    """An internal error of nbdist's own (here a body that moves its turn where the diagram has no edge) ends the
    step like any other early end: the other rank, waiting at the cell's end, fails at once naming this rank."""
    bugged, waiting = pair
    bugged_turn = Turn()

    def cell(world: World, work: Work, t: Turn) -> Any:
        return steps.drive(t, world, Plan(CELL, meeting("barrier"), "x = 1\n", Claim(), work=work))

    met, box = in_thread(lambda: cell(waiting, Work(waiting), Turn()))
    with pytest.raises(TurnError, match="cannot go from body to meeting"):
        cell(bugged, Work(bugged, body=lambda: bugged_turn.enter(Phase.MEETING)), bugged_turn)
    met.join(WAIT)
    assert isinstance(box.get("error"), PeerFailedError)
    assert "rank 0 (h, pid 1) stopped: nbdist's turn cannot go from body to meeting" in str(box["error"])
    assert bugged_turn.phase is Phase.DONE


MOVES = {"enter", "done", "arrived", "meet", "meet_end", "abort", "_move"}  # Turn's moves, as distinct from its claims


def test_only_the_turn_and_the_driver_move_a_turn():
    """Every kind of step goes through :func:`nbdist.cell.step.drive`: no other module names a phase or calls a move
    of a turn (``world.meet``'s ``meeting.arrived`` is the world's pure decision, another module)."""
    package = Path(nbdist.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() in ("cell/turn.py", "cell/step.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id == "Phase":
                found.append(f"{path.name}:{node.lineno} names Phase")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MOVES
                    and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "meeting")):
                found.append(f"{path.name}:{node.lineno} calls .{node.func.attr}()")
    assert found == []
