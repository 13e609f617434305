"""One rank's kernel for the explorer: nbdist's own :class:`nbdist.session.Session`, without IPython or a body.

Its ``%%collective`` runs the session's real steps, IPython's order: ``before_cell`` (``pre_run_cell``), the magic
(``Session.collective``, which runs :func:`nbdist.cell.cells.run`), ``after_cell`` (``post_run_cell``, whose errors
IPython swallows); its ``%dist_barrier`` is ``Session.barrier``, its ``%dist_status`` ``Session.status``. Only what a
kernel adds around the protocol is left out: the hang report, the body (nothing runs, so no watcher;
:attr:`Session.run_body`; or, where a scenario asks, one collective's comparison with the others) and the process
group (every rank holds one it trusts, :class:`Trusted`). The stop button is what a SIGINT does on a kernel's main
thread: recorded while nbdist holds it (:class:`nbdist.cell.stops.Stops`), raised where it lands otherwise. A
stop that nbdist sends (the driver's stop at a follower, ``%dist_stop``, ``--max-time``: a watcher's
:class:`~nbdist.errors.StopRequest`) goes through the kernel's real :class:`~nbdist.cell.stopper.Stopper`, whose
signal's handler raises it on the main thread while the stopper is armed (from ``pre_run_cell`` to the end of a
``%%collective``'s body): :class:`GateStopper`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, TypeVar

from nbdist.backend.backends import Choice
from nbdist.cell import capture, cellerror, cells
from nbdist.cell.stopper import SIGNAL, Stopper
from nbdist.errors import StoppedError
from nbdist.session import Session
from nbdist.world import verdict as verdicts
from nbdist.world.capture_record import Capture
from nbdist.world.verdict import Verdict
from nbdist.world.world import World

from .explorer import Hooks
from .gate import Hung, Killed

T = TypeVar("T")
SENT = "stopped by nbdist stop in a terminal"  # the message of a stop that nbdist sends


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


class GateStopper(Stopper):
    """The kernel's stopper on a simulated rank, which has no main thread of its own: a stop sent to it runs the
    signal's real handler at once, on the rank's thread, at the store operation where the stop lands (a handler
    runs between two bytecodes); armed, the handler raises it there, as on a kernel's main thread."""

    def __init__(self) -> None:
        super().__init__()
        self._installed = True  # as after the join (Stopper.install), without taking over the process's signal

    def _signal(self) -> None:
        self._handle(SIGNAL, None)


def _no_body(b: cells.Body) -> cells.Ran:
    """The body of an explorer's cell: nothing runs (the stop button raises in it, as in a body of the user's);
    the stopper is armed for it and paused after it, as :func:`nbdist.cell.cells.watched_body` does."""
    return _body(b, lambda: None)


RAISED = "the notebook's own error"  # what a body that raises (a scenario's) raises, as a ValueError


def _comparing_body(raises: str | None = None) -> Callable[[cells.Body], tuple[dict[str, Any], dict[str, Any] | None,
                                                                              bool]]:
    """A body whose one collective is compared with the others' first (its checker's real comparison, a barrier
    of no step), as the default group's first all_reduce of a cell is; ``raises``: "before" or "after" that
    collective, the body raises ``ValueError(RAISED)``."""

    def body(b: cells.Body) -> cells.Ran:
        def all_reduce() -> None:
            if raises == "before":
                raise ValueError(RAISED)
            b.checker.agree({"op": "all_reduce"}, "0", 1, None)
            b.checker.counts["0"] = 1  # as Checker.call counts it, once compared
            if raises == "after":
                raise ValueError(RAISED)

        return _body(b, all_reduce)

    return body


def _body(b: cells.Body, code: Callable[[], None]) -> cells.Ran:
    """Run ``code`` as a body runs: what it raises is the body's error, as its capture records it."""
    error = None
    if b.stopper is not None:
        b.stopper.arm()
    try:
        with b.turn.stops.released():
            try:
                code()
            except (Killed, Hung):
                raise
            except BaseException as exc:  # the body's own, as capture.run_cell records it
                error = capture.error_of(exc)
    finally:
        if b.stopper is not None:
            b.stopper.pause()
            b.stopper.disarm()
    return Capture(outputs=[], result=None, error=error, wall=0.0), None, False


class Kernel:
    """See the module docstring."""

    def __init__(self, world: World, hooks: Hooks, cut: str | None = None, rebuilds: bool = False,
                 compares: bool = False, raises: str | None = None) -> None:
        session = Session(None)
        session.world, session.watch_client = world, world.client
        session.process = "explorer"  # no front end: it draws no live table
        session.run_body = _comparing_body(raises) if compares or raises else _no_body
        session.stopper = GateStopper()
        # No hang report: it asks every rank where it is from a thread of its own (%dist_where's protocol, not the
        # turn's), whose store calls would reach the scheduler's gates from outside the rank's thread.
        session.aids.hang = lambda world, asks: None  # type: ignore[method-assign]
        world.pg = Trusted(world.gen)
        if cut is not None or rebuilds:  # its group can be rebuilt (.groups); cut (a stopped collective): it must be
            from .groups import Link

            if cut is not None:
                world.pg.cut(cut)
            session.shell = SimpleNamespace(user_ns={})  # where a rebuilt cell looks for names holding the old group
            session.client, session.choice = Link(world.client), Choice("gloo", "cpu", "the explorer's")
        self.session, self.world, self.timeout = session, world, hooks.timeout
        hooks.on_stop(self._press)
        hooks.on_sent_stop(self._sent)

    def _press(self) -> None:
        stops = self.session.turn.stops
        if stops.holding:
            stops.press()
        else:
            raise KeyboardInterrupt

    def _sent(self) -> None:
        """A watcher sends a stop (a stop of every rank, say): raised here if the stopper is armed, else dropped."""
        self.session.stopper.stop(StoppedError(SENT))

    def collective(self, body: str, start_turn: int | None = None,
                   start_error: BaseException | None = None) -> Verdict:
        """One ``%%collective`` from ``pre_run_cell`` to ``post_run_cell``; how its start opened (go, or a rebuild).

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

        def run() -> Verdict:
            if start_error is not None:
                raise start_error
            outcome = session.collective(body, cells.Flags(self.timeout, live=False))
            error = cellerror.error_for(session.world, outcome)  # as the magic ends the cell, once its table is shown
            if error is not None:
                raise error
            return opened(outcome)

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

    def dist_status(self) -> list[str]:
        """One ``%dist_status``: each rank's last activity as it shows it (:meth:`Session.status`), in rank order."""
        return [row["last"] for row in self.session.status()]

    def dist_barrier(self) -> Verdict:
        """One ``%dist_barrier``; it opened (else it raised)."""
        self.session.barrier(self.timeout)
        return verdicts.GO


def opened(outcome: cells.Outcome) -> Verdict:
    """How a cell that ran opened: a plain go, or a rebuild of the process group first (and why)."""
    return verdicts.GO if outcome.rebuilt is None else verdicts.rebuild(outcome.rebuilt)


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


def kernel(world: World, hooks: Hooks, cut: str | None = None, rebuilds: bool = False,
           compares: bool = False, raises: str | None = None) -> Kernel:
    """This rank's kernel (``cut``: its process group was cut, for this reason; ``rebuilds``: a scenario whose
    stops may make the next cell rebuild it, :func:`.groups.modelled`; ``compares``: its body compares one
    collective with the others; ``raises``: and raises "before" or "after" it)."""
    return Kernel(world, hooks, cut, rebuilds, compares, raises)
