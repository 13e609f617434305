"""What a finished %%collective shows in a notebook: its table, the group's note, its timeline if traced.

The same for the notebook that ran the cell and for a following one (:mod:`nbdist.drive.follow`).
"""

from __future__ import annotations

from typing import Any

from IPython.display import display, update_display

from .. import ranksets
from ..view import trace
from ..view.celltable import CellTable, cell_table
from ..view.display import Message
from ..view.timeline import Timeline
from ..world.capture_record import Capture
from . import cells


def show(world: Any, outcome: cells.Outcome) -> list[dict[str, Any]] | None:
    """Show the cell's table, and its timeline if it was traced; returns the traced calls (None: not traced)."""
    show_table(world, outcome)
    traced = [None if c is None else c.trace for c in outcome.captures]
    if all(t is None for t in traced):
        return None
    calls = trace.merge(traced)
    display(Timeline(calls, world.world_size, f"%%collective #{outcome.number}"))
    return calls


def final_table(world: Any, outcome: cells.Outcome) -> CellTable:
    """The cell's side-by-side table, drawn as its ``view`` and ``show`` say, with the group's note."""
    captures = outcome.captures
    none = Capture(outputs=[{"kind": "note", "text": "(no result from this rank)"}], result=None, error=None, wall=0.0)
    shown = [c or none for c in captures]
    title = f"%%collective #{outcome.number} · {world.world_size} ranks"
    if any(c is None for c in captures):
        title += " · partial: some ranks sent no result"
    drawn = cell_table(title, world.registrations(), shown, view=outcome.view,
                       show=None if outcome.show is None else list(outcome.show))
    drawn.footer = "\n".join(note for note in (group_note(outcome), debug_hint(captures), where_note(outcome))
                              if note)
    return drawn


def show_table(world: Any, outcome: cells.Outcome) -> None:
    """The cell's table, in place of its live one if it had one."""
    table = final_table(world, outcome)
    if outcome.live_id is not None:  # the final table replaces the live one, in place
        update_display(table, display_id=outcome.live_id)
    elif table.rows:  # like a plain cell, a cell that showed nothing on any rank shows nothing
        display(table)
    elif table.footer:
        display(Message(table.footer))


def where_note(outcome: cells.Outcome) -> str:
    """Where every rank was while the cell hung (:mod:`nbdist.debug.hangs`), if it ended badly: stopped, timed
    out, failed on a rank, or cut for a mismatch."""
    failed = outcome.reason is not None or outcome.mismatch is not None or any(
        c is None or c.error is not None for c in outcome.captures)
    return outcome.where or "" if failed else ""


def group_note(outcome: cells.Outcome) -> str:
    """What happened to the process group, and what user code must re-create."""
    held = ", ".join(outcome.holders) or "DDP models and groups made with new_group"
    if outcome.distrusted:
        return (f"nbdist: the process group cannot be trusted after this cell ({outcome.distrusted}); every rank "
                f"rebuilds it at the next %%collective. After that, re-create what held the old one: {held}.")
    if outcome.rebuilt:
        again = f" Re-create what held the old one: {held}." if outcome.holders else ""
        return f"nbdist: the process group was rebuilt before this cell ({outcome.rebuilt}).{again}"
    return ""


def failing_ranks(captures: list[Capture | None]) -> list[int]:
    """The ranks whose body raised an error of its own (not the stop button, not a collective the cell cut)."""
    return [i for i, cap in enumerate(captures)
            if cap is not None and (error := cap.error) is not None and not error.interrupted
            and not error.consequence and not cap.cancelled]


def debug_hint(captures: list[Capture | None]) -> str:
    """The failed cell's one line offering the debugger (%dist_pdb), "" when no rank's body failed of its own."""
    failing = failing_ranks(captures)
    if not failing:
        return ""
    more = f" (failed: {ranksets.ranks_text(failing)})" if len(failing) > 1 else ""
    return f"Debug a failing rank: %dist_pdb {failing[0]}{more}"
