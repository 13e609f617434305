"""One kernel's side of its cells: the running cell's turn, the stop button around it, and the watchers.

The session holds one :class:`KernelTurn` for the kernel's life. IPython's ``pre_run_cell`` and
``post_run_cell`` events run :meth:`KernelTurn.before_cell` and :meth:`KernelTurn.after_cell`: a
``%%collective`` claims the world's next step as it begins, and one stopped before nbdist's code ran still
takes that step, closed (:mod:`nbdist.cell.turn`). The guard (a stop of every rank) runs while the kernel is in
a world; the collectives' hooks, the stopper and the prestart window from ``%load_ext`` to its unload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import StoppedError
from ..world.link import sync_generation
from ..world.records import WORLD, Failure, StopAll
from ..world.store import StoreClient
from . import capture, cells, prestart, progress, turn, watchthread
from .guard import Guard
from .hooks import Collectives
from .plain import DriveSide, Linked, PlainNet
from .stopper import Stopper
from .stops import Stops


class KernelTurn:
    """See the module docstring. ``link``: the kernel's world; ``driving`` and ``ensure_group``: what the plain-cell
    watcher needs (:class:`nbdist.cell.plain.PlainNet`)."""

    def __init__(self, link: Linked, driving: DriveSide, ensure_group: Callable[[], str | None]) -> None:
        self.link = link
        self.hooks = Collectives()
        self.stopper = Stopper()  # lets nbdist's watchers end the running cell (--max-time, %dist_stop)
        self.guard: Guard | None = None
        # the watcher of a plain cell that calls a collective
        self.plain = PlainNet(link, self.hooks, self.stopper, driving, ensure_group)
        # The running cell's turn at its step (nbdist.cell.turn): a %%collective claims the world's next step as
        # the cell begins (its pre_run_cell), even if another rank's same cell closes that step before this one
        # reaches nbdist's code.
        self.stops = Stops()  # the kernel's stop state, from a press between cells to where the turn takes it
        self.turn = turn.Turn(self.stops)
        self.prestart = prestart.Window(self.stops)  # the stop button just before or after a cell (installed at load)
        self.view: str | None = None  # %dist_config view=: how this notebook draws tables (None: by the ranks)
        self.run_body = cells.watched_body  # how a %%collective's body runs (the interleaving explorer's has none)
        self.first_note: str | None = None  # what this rank's next %%collective says first (cells.new_namespace)
        self.took_over = False  # this kernel took over another's slot: its NameErrors carry its names (cell.names)

    # --- in a world ----------------------------------------------------------
    def join(self, pg_timeout: float) -> None:
        """As the rank joins: the collectives' hooks, the stopper and the plain-cell safety net in place."""
        self.hooks.group_timeout = pg_timeout
        self.hooks.install()
        self.stopper.install()
        self.hooks.on_plain = self.plain.checker

    def start_guard(self, client: StoreClient, key: Callable[[str], str], rank: int, session: str) -> None:
        """Watch for a stop of every rank (%dist_stop, nbdist stop) on ``client``, a connection of its own."""
        self.guard = Guard(client, key, rank, session, self.stop_requested)

    def stop_requested(self, stop: StopAll) -> None:
        """The guard saw a stop of every rank (%dist_stop, nbdist stop) while a cell runs here."""
        watch = self.stopper.watch
        if watch is not None:  # it cuts a collective that is waiting
            watch.stop_all(Failure(WORLD, "stopped", stop.message))
        else:
            self.stopper.stop(StoppedError(stop.message))

    def leave(self) -> None:
        """Leaving the world, first: the plain cell's watcher ends, and the guard stops."""
        self.plain.end()
        self.first_note, self.took_over = None, False
        if self.guard is not None:
            self.guard.stop()
            self.guard = None

    def forget_group(self) -> None:
        """Leaving the world, once its group is gone: the hooks check against none."""
        self.hooks.active, self.hooks.pg = None, None

    def close(self) -> None:
        """Unload or exit, after leaving: the hooks, streams, stopper and prestart window, as they were."""
        self.hooks.uninstall()
        capture.unroute_streams()
        progress.unpatch()
        self.stopper.uninstall()
        self.prestart.uninstall()
        watchthread.stop()  # the cells' watching thread, once the last watch has ended

    # --- IPython's cell events ---------------------------------------------------
    def before_cell(self, info: Any = None, *_: Any) -> None:
        """IPython's pre_run_cell event: a cell of the user runs from now (a stop may end it).

        A ``%%collective`` cell takes the world's next step now: a rank whose same cell fails before
        nbdist's code (a typo in its flags) closes that step, and this rank, arriving after, fails at once
        with the reason instead of waiting at the step after it.
        """
        late = self.prestart.started()
        stops = self.stops
        raw = getattr(info, "raw_cell", "") or ""
        # A press while this runs would raise inside IPython's event loop, which swallows it: hold it for the cell.
        with stops.held(take=False):
            world = self.link.world
            self.turn.cell_began(world, raw)
            if world is not None:
                self.stopper.arm()
                self.plain.begin(raw)  # a plain cell is watched from its start
                if self.guard is not None:
                    self.guard.new_cell()
                    self.guard.running = True
        stops.began(late)

    def after_cell(self, result: Any) -> None:
        """IPython's post_run_cell event: a %%collective stopped before its turn still takes it, closed.

        The stop button can land before nbdist's code runs (IPython, the magic's
        flags); without this, the other ranks would wait for this one until their
        --timeout.
        """
        raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        error = getattr(result, "error_before_exec", None) or getattr(result, "error_in_exec", None)
        self.plain.end(error)
        self.prestart.ended()
        self.stops.ended()
        self.stopper.reset()  # not disarm(): an arm whose disarm a stop cut short must not outlive the cell
        if self.guard is not None:
            self.guard.running = False
        try:
            world = self.link.world
            if world is not None:
                self.turn.cell_ended(world, turn.CellEnded.of(raw, error), lambda: sync_generation(world))
        finally:
            self.turn.begin()
