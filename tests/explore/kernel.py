"""One rank's kernel for the explorer: nbdist's own :class:`nbdist.session.Session`, without IPython or a body.

Its ``%%collective`` runs the session's real steps, IPython's order: ``before_cell`` (``pre_run_cell``), the
magic (``Session.collective``, which runs :func:`nbdist.cell.cells.run`), ``after_cell`` (``post_run_cell``, whose
errors IPython swallows); its ``%dist_barrier`` is ``Session.barrier``. Only what a kernel adds around the
protocol is left out: the body (nothing runs, so no watcher; :attr:`Session.run_body`) and the process group
(every rank holds one it trusts, :class:`Trusted`). The stop button is what a SIGINT does on a kernel's main
thread: recorded while nbdist holds it (:class:`nbdist.cell.turn.StopButton`), raised where it lands otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, TypeVar

from nbdist.backend.backends import Choice
from nbdist.cell import cells
from nbdist.session import Session
from nbdist.world.world import World

from .explorer import Hooks
from .gate import Hung, Killed

T = TypeVar("T")


class Trusted:
    """A process group every rank trusts, for a world whose ranks build none (what the cells compare of it)."""

    def __init__(self, gen: int) -> None:
        self.gen, self.broken, self.reason = gen, False, ""

    def state(self) -> dict[str, Any]:
        return {"ok": True} if not self.broken else {"ok": False, "why": self.reason}

    def distrust(self, reason: str) -> None:
        self.broken, self.reason = True, reason

    def cut(self, reason: str = "") -> None:
        self.distrust(reason)

    def destroy(self) -> None:
        return None

    def is_current(self) -> bool:
        return True


def _no_body(b: cells.Body) -> tuple[dict[str, Any], dict[str, Any] | None, bool]:
    """The body of an explorer's cell: nothing runs (the stop button raises in it, as in a body of the user's)."""
    with b.turn.stops.released():
        pass
    return {"outputs": [], "result": None, "error": None, "wall": 0.0}, None, False


class Kernel:
    """See the module docstring."""

    def __init__(self, world: World, hooks: Hooks, cut: str | None = None, rebuilds: bool = False) -> None:
        session = Session(None)
        session.world, session.watch_client = world, world.client
        session.process = "explorer"  # no front end: it draws no live table
        session.run_body = _no_body
        world.pg = Trusted(world.gen)
        if cut is not None or rebuilds:  # its group can be rebuilt (.groups); cut (a stopped collective): it must be
            from .groups import Link

            if cut is not None:
                world.pg.cut(cut)
            session.shell = SimpleNamespace(user_ns={})  # where a rebuilt cell looks for names holding the old group
            session.client, session.choice = Link(world.client), Choice("gloo", "cpu", "the explorer's")
        self.session, self.world, self.timeout = session, world, hooks.timeout
        hooks.on_stop(self._press)

    def _press(self) -> None:
        stops = self.session.turn.stops
        if stops.holding:
            stops.press()
        else:
            raise KeyboardInterrupt

    def collective(self, body: str, start_turn: int | None = None, start_error: BaseException | None = None) -> str:
        """One ``%%collective`` from ``pre_run_cell`` to ``post_run_cell``; the state its start opened with.

        ``start_turn``: the step ``pre_run_cell`` read already, before any event (None: it reads it here).
        ``start_error``: the magic raises it before nbdist's code runs (a typo in its flags).
        """
        session = self.session
        info = SimpleNamespace(raw_cell=f"%%collective\n{body}")
        if start_turn is None:
            with post_run_cell():  # pre_run_cell's errors are IPython's too
                session.before_cell(info)
        else:
            session.turn.begin()
            session.turn.claim(start_turn)

        def run() -> str:
            if start_error is not None:
                raise start_error
            outcome = session.collective(body, cells.Flags(self.timeout, live=False))
            return "go" if outcome.rebuilt is None else f"go:rebuild:{outcome.rebuilt}"

        return self._until_post_run_cell(info, run)

    def plain(self) -> str | None:
        """A plain cell from ``pre_run_cell`` to ``post_run_cell`` whose first collective rebuilds the group if it must
        (:func:`nbdist.cell.rebuild.ensure`); why it rebuilt, or None."""
        session = self.session
        info = SimpleNamespace(raw_cell="dist.all_reduce(t)")
        with post_run_cell():
            session.before_cell(info)
        return self._until_post_run_cell(info, session.ensure_group)

    def _until_post_run_cell(self, info: SimpleNamespace, run: Callable[[], T]) -> T:
        """The cell's own part, then ``post_run_cell`` told how it ended (a killed or hung rank tells nothing)."""
        error: BaseException | None = None
        try:
            return run()
        except (Killed, Hung):
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            with post_run_cell():
                self.session.after_cell(SimpleNamespace(info=info, error_before_exec=None, error_in_exec=error))

    def dist_barrier(self) -> str:
        """One ``%dist_barrier``; the state it opened with."""
        self.session.barrier(self.timeout)
        return "go"


@contextlib.contextmanager
def post_run_cell() -> Iterator[None]:
    """What ``Session.after_cell`` raises goes no further: IPython's ``EventManager.trigger`` swallows it (a second
    press of the stop button there ends only the telling). A killed kernel runs nothing more either way."""
    try:
        yield
    except (Killed, Hung):
        raise
    except BaseException:  # IPython's, not ours: it prints the error and carries on
        pass


def kernel(world: World, hooks: Hooks, cut: str | None = None, rebuilds: bool = False) -> Kernel:
    """This rank's kernel (``cut``: its process group was cut, for this reason; ``rebuilds``: a scenario whose
    stops may make the next cell rebuild it, :func:`.groups.modelled`)."""
    return Kernel(world, hooks, cut, rebuilds)
