"""Registering nbdist in a kernel (``%load_ext``, ``%unload_ext``) and the Python API that reaches the magics."""

from __future__ import annotations

import atexit
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from .cell import outcome_view
from .divergemagics import NAME as DIVERGE_NAME
from .divergemagics import DivergeMagics
from .errors import NotInitializedError
from .healmagics import NAME as HEAL_NAME
from .healmagics import HealMagics
from .magics import _NAME, DistMagics, registered
from .view.display import Message


def rank_output(rank: int, full: bool = False) -> Any:
    """Rank ``rank``'s whole column of the last %%collective table shown in this notebook; ``full``: every line
    it printed, as text, from the file it kept (:mod:`nbdist.cell.wholeoutput`)."""
    magics = registered()
    outcome = magics.last_outcome if magics is not None else None
    world = magics.session.world if magics is not None else None
    if magics is None or outcome is None or world is None:
        raise UsageError("nbdist.rank_output: this notebook has shown no %%collective table yet")
    if not 0 <= rank < world.world_size:
        raise UsageError(f"nbdist.rank_output: rank {rank} is not in this world (ranks 0-{world.world_size - 1})")
    if full:
        try:
            return magics.session.whole_output(rank, outcome.captures[rank])
        except LookupError as exc:
            raise UsageError(f"nbdist.rank_output: {exc}") from None
    return outcome_view.final_table(world, replace(outcome, view="ranks", show=(rank,)))


def current_device() -> Any:
    """This kernel's rank device (``nbdist.get_device()``)."""
    magics = registered()
    if magics is None or magics.session.world is None:
        raise NotInitializedError("nbdist.get_device()")
    return magics.session.device


def bare_cell_magic_as_line(lines: list[str]) -> list[str]:
    """Let ``%%dist_init --flags`` stand alone in a cell (IPython refuses empty cell magics)."""
    if lines and lines[0].lstrip().startswith("%%dist_init") and not "".join(lines[1:]).strip():
        return [lines[0].lstrip()[1:]]
    return lines


def load(shell: Any) -> None:
    """Register the magics (``%load_ext nbdist``)."""
    magics = DistMagics(shell)
    shell.register_magics(magics, HealMagics(shell, magics), DivergeMagics(shell, magics))
    if bare_cell_magic_as_line not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(bare_cell_magic_as_line)
    magics.session.prestart.install(shell)
    shell.events.register("pre_run_cell", magics.session.before_cell)
    shell.events.register("post_run_cell", magics.session.after_cell)
    atexit.register(magics.session.close_at_exit)
    magics.session.prepare()
    for note in magics.session.notes:
        display(Message(f"nbdist: warning: {note}"))


def unload(shell: Any) -> None:
    """Leave the world, stop the server and threads, remove the magics (``%unload_ext``)."""
    magics = shell.magics_manager.registry.pop(_NAME, None)
    heal = shell.magics_manager.registry.pop(HEAL_NAME, None)
    diverge = shell.magics_manager.registry.pop(DIVERGE_NAME, None)
    if magics is None:
        return
    magics._stop_dashboard("nbdist was unloaded")
    magics.session.close()
    atexit.unregister(magics.session.close_at_exit)
    for event, callback in (("pre_run_cell", magics.session.before_cell), ("post_run_cell", magics.session.after_cell)):
        if callback in shell.events.callbacks[event]:
            shell.events.unregister(event, callback)
    shell.input_transformers_cleanup[:] = [
        t for t in shell.input_transformers_cleanup if getattr(t, "__name__", "") != "bare_cell_magic_as_line"
    ]
    for declared in (magics, heal, diverge):
        for kind, names in type(declared).magics.items() if declared is not None else ():  # every magic it declares
            for name in names:
                shell.magics_manager.magics[kind].pop(name, None)
