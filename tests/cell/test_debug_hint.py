"""A failed cell's table offers the debugger in one line, for a rank whose body failed of its own (no kernels)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from nbdist.cell import cells, outcome_view
from nbdist.world.capture_record import Capture


def capture(error: dict[str, Any] | None = None, **more: Any) -> Capture:
    return Capture.from_dict({"outputs": [], "result": None, "error": error, "wall": 0.01, **more})


ZERO = {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": "", "short": ""}
WORLD = SimpleNamespace(world_size=3, registrations=lambda: [{"host": "h", "pid": i} for i in range(3)])


def test_the_table_of_a_failed_cell_ends_with_the_line_that_debugs_the_rank_that_raised():
    stopped = capture({**ZERO, "ename": "KeyboardInterrupt", "interrupted": True})
    cut = capture({**ZERO, "ename": "DistBackendError", "consequence": True}, cancelled="rank 1 raised")
    table = outcome_view.final_table(WORLD, cells.Outcome(4, [cut, capture(ZERO), stopped]))
    assert table.footer == "Debug a failing rank: %dist_pdb 1"
    assert "Debug a failing rank: %dist_pdb 1" in table._repr_html_()


def test_several_failing_ranks_are_named_after_the_first_and_a_cell_that_succeeded_offers_nothing():
    assert outcome_view.debug_hint([capture(), capture(ZERO), None, capture(ZERO)]) == \
        "Debug a failing rank: %dist_pdb 1 (failed: ranks 1,3)"
    assert outcome_view.final_table(WORLD, cells.Outcome(5, [capture(), capture(), capture()])).footer == ""


def test_the_group_note_and_the_debug_line_stand_on_lines_of_their_own():
    outcome = cells.Outcome(6, [capture(ZERO), capture(), capture()], distrusted="a collective was cut")
    table = outcome_view.final_table(WORLD, outcome)
    note, hint = table.footer.split("\n")
    assert note.startswith("nbdist: the process group cannot be trusted") and hint.endswith("%dist_pdb 0")
    assert "re-create what held the old one: DDP models and groups made with new_group.<br>Debug a failing rank" in \
        table._repr_html_()
