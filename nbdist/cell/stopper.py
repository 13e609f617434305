"""Ending the running cell from a watcher thread: a signal to the main thread, whose handler raises there.

One of the inputs of a rank's stop state (:mod:`nbdist.cell.stops`): while a body runs, the stop a watcher sends
(``--max-time``, a stop of every rank, a collective the others did not issue) is raised in it, as the stop
button's press is.

A thread cannot raise in another; a signal handler runs on the main thread,
between two bytecodes, and interrupts a blocking sleep or wait as the stop
button does. nbdist uses SIGUSR2 for this, armed only while a cell of the
user runs, so a late signal never lands in the kernel's own loop. A body
inside a C call that does not return (a collective) is the watcher's to cut
first; the handler then raises as soon as Python runs again.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

SIGNAL = signal.SIGUSR2


@contextlib.contextmanager
def _held_off() -> Iterator[None]:
    """Hold the signal back on the main thread: its handler takes the lock this thread may hold (a deadlock)."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = mask(signal.SIG_BLOCK, {SIGNAL})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, previous)  # a signal held back arrives now; disarmed, it raises nothing


class Stopper:
    """Raises a given exception in the main thread, while armed."""

    def __init__(self) -> None:
        self._pending: BaseException | None = None
        self._armed = 0
        self._paused = False
        self._old: Any = None
        self._installed = False
        self.lock = threading.Lock()
        self.watch: Any = None  # the CellWatch of the running cell, if it has one (it cuts what must be cut)

    def install(self) -> None:
        """Take over the signal (main thread only; idempotent)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._old = signal.signal(SIGNAL, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(SIGNAL, self._old if self._old is not None else signal.SIG_DFL)
            self._installed = False

    @property
    def armed(self) -> bool:
        return self._armed > 0

    def arm(self) -> None:
        with _held_off(), self.lock:
            self._armed += 1
            self._paused = False

    def disarm(self) -> None:
        with _held_off(), self.lock:
            self._armed = max(0, self._armed - 1)
            if not self._armed:
                self._pending, self._paused = None, False

    def reset(self) -> None:
        """The user's cell ended (IPython's post_run_cell): nothing is armed, whatever ended the cell early."""
        with _held_off(), self.lock:
            self._armed, self._pending, self._paused = 0, None, False

    def pause(self) -> None:
        """A %%collective body ended: nothing raises until the next arm, while nbdist's own code ends the cell.

        The cell stays armed for the stop of a plain cell (IPython's cell events arm it), so a stop that a
        watcher sends as the body ends would otherwise land in the cell's bookkeeping and cut this rank
        out of the cell's end, which the others then wait for.
        """
        with _held_off(), self.lock:
            self._pending, self._paused = None, True

    def stop(self, exc: BaseException) -> bool:
        """Raise ``exc`` in the main thread, if a cell is running there; True if it was sent."""
        with self.lock:
            if not self._installed or not self._armed or self._paused or self._pending is not None:
                return False
            self._pending = exc
        self._signal()
        return True

    def _signal(self) -> None:
        """Send the signal to the main thread, whose handler raises the pending stop (the explorer's simulated
        ranks, which have no main thread of their own, take it at the store operation where it lands)."""
        signal.pthread_kill(threading.main_thread().ident, SIGNAL)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: Any) -> None:
        with self.lock:
            exc, self._pending = self._pending, None
            armed = self._armed > 0 and not self._paused
        if exc is not None and armed:
            # What it interrupted (a collective the watcher cut fails with gloo's "Connection closed by peer")
            # is how it stopped, not why: the exception's message says why.
            exc.__suppress_context__ = True
            raise exc
        log.debug("nbdist: a stop signal arrived with no cell to stop")
