"""nbdist: Jupyter notebooks as the ranks of one torch.distributed world.

``%load_ext nbdist`` registers the magics. Nothing here imports torch: the
backend is detected first, so that a broken accelerator plugin cannot break
``import torch`` in the kernel.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .view.pictures import Picture

__all__ = ["__version__", "breakpoint", "check_replicas", "get_device", "last_trace", "load_ipython_extension",
           "picture", "rank_output", "show", "unload_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    from .extension import load

    load(ipython)
    # nbdist.check_replicas(...), nbdist.get_device() in a cell, as the docs write them (a name of the user's wins)
    ipython.user_ns.setdefault("nbdist", sys.modules[__name__])


def unload_ipython_extension(ipython: Any) -> None:
    from .extension import unload

    unload(ipython)


def breakpoint(ranks: str | int | list[int] | None = None) -> None:  # noqa: A001 (the name users look for)
    """Stop in the debugger on ``ranks`` only (``"1,3"``, ``"0-2"``, ``2``, a list; None: every rank).

    In a ``%%collective`` body: as ``breakpoint()`` there, in that rank's notebook, or relayed to the driving
    notebook for a driven rank (see the how-to "Debug a hang"). Elsewhere, Python's debugger on the listed
    ranks, as ``breakpoint()`` in a torchrun script.
    """
    import sys

    from .debug.breakpoints import breakpoint as stop

    stop(ranks, sys._getframe(1))


def check_replicas(model: Any, optimizer: Any = None, every: int = 1) -> None:
    """Raise ``nbdist.errors.ReplicasDifferError`` at the first step where the ranks' ``model`` (or ``optimizer``'s
    state) differ, naming the step, the first entry that differs and the ranks holding each value.

    Call it in the training loop, on every rank, after the optimizer's step: it counts its calls as steps, and at
    the first and every ``every``-th after compares the ranks' digests with one small collective (no data moves).
    """
    from .diverge.replicas import check_replicas as check

    check(model, optimizer, every)


def get_device() -> Any:
    """The ``torch.device`` this kernel's rank uses (after ``%%dist_init``)."""
    from .extension import current_device

    return current_device()


def picture(tensor: Any, label: str | None = None, owner: Any = None, *, world_size: int | None = None) -> Picture:
    """A picture of ``tensor``, each value coloured by its owning rank (see :mod:`nbdist.view.pictures`)."""
    from .view.pictures import picture as draw

    return draw(tensor, label, owner, world_size=world_size)


def show(tensor: Any, label: str | None = None, owner: Any = None, *, world_size: int | None = None) -> None:
    """Display :func:`picture` of ``tensor`` (returns None, so it draws once as a cell's last line)."""
    from .view.pictures import show

    show(tensor, label, owner, world_size=world_size)


def rank_output(rank: int, full: bool = False) -> Any:
    """Rank ``rank``'s whole column of the last ``%%collective`` table this notebook showed (a table to display).

    ``full=True``: every line that rank printed in that cell, as text (``print()`` it, or ``.splitlines()``), also
    where the table showed only its first and latest lines; kept on that rank's disk until it leaves the world.
    """
    from .extension import rank_output as column

    return column(rank, full)


def last_trace() -> list[dict[str, Any]]:
    """The calls of this notebook's last ``%%collective --trace`` cell, every rank's, in order of entry.

    Each is a dict: ``rank``, ``group`` (torch's group name, "0" for the world), ``seq`` (its number in
    that group in the cell; None for send/recv), ``op``, ``bytes``, ``enter`` and ``leave`` (seconds
    since that rank left the cell's start barrier). ``nbdist.view.trace.lateness(calls)`` groups them per
    collective with who arrived last and each rank's wait.
    """
    from .magics import registered

    magics = registered()
    return list(magics.last_trace) if magics is not None else []
