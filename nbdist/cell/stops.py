"""One rank's stop state, in one object: what stopped, where it landed, and where the turn takes it.

A stop is one typed event, :class:`Stop`: the stop button's press, or a stop nbdist sent (a
:class:`~nbdist.errors.StopRequest`: the driver's stop at a follower, ``%dist_stop``, ``--max-time``). Where it
lands decides what it stops, and :class:`Stops` (one per kernel) keeps it until then:

- between two cells (ipykernel's gaps, :mod:`nbdist.cell.prestart` records the press): the next cell takes it;
- as a cell begins (IPython's ``pre_run_cell``, where a raise would be swallowed): a ``%%collective`` stops at
  once, as it reaches nbdist's code (:meth:`Stops.start`), and still takes its step, closed;
- in nbdist's own part of a step (:meth:`Stops.held`): recorded, and taken where the turn can act on it
  (:class:`nbdist.cell.turn.Turn`), never between two store calls; one that lands once every rank has arrived
  at the step's meeting is kept for what follows (:meth:`Stops.keep`);
- in the body (:meth:`Stops.released`): raised there, as the stop button always does.

Its inputs: SIGINT (swapped for :meth:`Stops.press` while held), the prestart window (between cells), and the
watchers' stops, which :class:`nbdist.cell.stopper.Stopper` raises in the main thread (a stop of every rank
reaches it from :class:`nbdist.cell.guard.Guard`).
"""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import StopRequest


class Kind(enum.Enum):
    PRESS = "press"  # the stop button
    SENT = "sent"  # a stop nbdist sent


@dataclass(frozen=True)
class Stop:
    """One stop: a press, or the stop nbdist sent (``request``), which is raised as itself."""

    kind: Kind
    request: StopRequest | None = None

    @classmethod
    def of(cls, landed: BaseException) -> Stop:
        """The stop that ``landed`` (a KeyboardInterrupt, a StopRequest) is."""
        return cls(Kind.SENT, landed) if isinstance(landed, StopRequest) else PRESS

    def error(self) -> KeyboardInterrupt:
        """What raising this stop raises: KeyboardInterrupt, as the stop button itself does, or the request."""
        return KeyboardInterrupt() if self.request is None else self.request.with_traceback(None)


PRESS = Stop(Kind.PRESS)


class Stops:
    """A rank's stop state (see the module docstring); one per kernel, shared by its turns."""

    def __init__(self) -> None:
        self._held: Stop | None = None  # what :meth:`check` raises
        self.between = False  # pressed between cells, not yet handed to a cell (nbdist.cell.prestart)
        self.at_start = False  # pressed as the running cell began: a %%collective stops on entry
        self._depth = 0
        self._saved: Any = None

    # --- as a cell begins and ends ---------------------------------------------------------
    def began(self, late: bool) -> None:
        """A cell began (``pre_run_cell``, after :meth:`held` without taking): a press held meanwhile, or one in
        the gap before (``late``: the prestart window's), is the cell's, taken as it reaches nbdist's code."""
        self.at_start = late or self.pressed or self.at_start
        self.drop()

    def start(self) -> None:
        """A ``%%collective`` reaches nbdist's code: a press as its cell began stops it now."""
        if self.at_start:
            self.at_start = False
            raise KeyboardInterrupt

    def ended(self) -> None:
        """The cell ended (``post_run_cell``): a press it did not take was for it, not for the next."""
        self.at_start = False

    # --- while nbdist's own part of a step runs -----------------------------------------------
    @property
    def pressed(self) -> bool:
        return self._held is not None

    @property
    def holding(self) -> bool:
        """Whether a press is recorded now rather than raised (nbdist's own part of a step runs)."""
        return self._depth > 0

    def press(self, *_: Any) -> None:
        """The stop button, while held (SIGINT's handler then)."""
        if self._held is None:
            self._held = PRESS

    def keep(self, landed: KeyboardInterrupt) -> None:
        """Hold ``landed``, which came where it could not be raised (once every rank had arrived at a meeting):
        :meth:`check` raises it with its kind and message."""
        self._held = Stop.of(landed)

    def drop(self) -> None:
        """Forget a held stop: what it would have stopped has ended."""
        self._held = None

    def check(self) -> None:
        """Take a held stop: raise it."""
        if self._held is not None:
            stop, self._held = self._held, None
            raise stop.error()

    @contextlib.contextmanager
    def held(self, take: bool = True) -> Iterator[None]:
        """Hold the stop button for the block; a press left untaken raises KeyboardInterrupt as the block ends
        (``take`` False: it stays in :attr:`pressed` for the caller, who must not raise where it is)."""
        self._depth += 1
        if self._depth == 1:
            self._held = None
            self._record()
        try:
            yield
        except BaseException:
            self._leave()
            raise  # the block ends anyway: a press held meanwhile is part of its end
        self._leave()
        if self._depth == 0 and take:
            self.check()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Let the stop button raise again for the block (a body of the user's); a press held so far raises first."""
        self.check()
        restore = self._depth > 0 and self._on_main()
        if restore:
            signal.signal(signal.SIGINT, self._saved)
        try:
            yield
        finally:
            if restore:
                signal.signal(signal.SIGINT, self.press)

    def _record(self) -> None:
        if self._on_main():
            saved = signal.signal(signal.SIGINT, self.press)
            self._saved = saved if callable(saved) else signal.default_int_handler

    def _leave(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._on_main() and self._saved is not None:
            signal.signal(signal.SIGINT, self._saved)
            self._saved = None

    @staticmethod
    def _on_main() -> bool:
        return threading.current_thread() is threading.main_thread()
