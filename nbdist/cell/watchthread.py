"""The thread that runs the cells' watches: one for the kernel's life, not one started and joined for every cell.

Every cell of a rank in a world has a watch beside its body (:class:`nbdist.cell.watch.CellWatch`): a
``%%collective``'s, and a plain cell's (its stop button, torch's own collectives). A thread of its own per cell cost
about 1.2 ms a cell here, in the cell's path: its start waits for the new thread to run, its end for the thread to
finish, and on 2 busy cores each of those waits is a wake-up of another thread, which often waits for the
scheduler's next tick (``docs/development/benchmarks.md``). Now one thread, started at the first watch, takes
each watch in turn: a cell hands it its watch and does not wait for it; a watch that ends takes its lock, which the
thread holds only while it acts for that cell, so an idle thread costs the cell no wait at all.

A second watch at once (a plain cell that runs a ``%%collective`` through ``run_cell_magic``) gets a thread of its
own, for its life, as every watch did before. The shared thread ends after :data:`LINGER` seconds without a watch
(a later one starts it again), and at once with :func:`stop` (nbdist unloaded).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

log = logging.getLogger(__name__)

LINGER = 60.0  # seconds the shared thread waits for a next watch before it ends


class Watch(Protocol):
    """What the thread runs: :meth:`CellWatch.watch <nbdist.cell.watch.CellWatch.watch>`, until the watch ends."""

    def watch(self, read_fd: int) -> None: ...

    def ended(self) -> bool: ...


class Runner:
    """A thread that runs watches one after another, and its pipe: signal bytes (``signal.set_wakeup_fd``) and its
    own wake-ups (``b"\\0"``) come in on it. ``linger``: how long it waits idle for a next watch (0: it runs one).
    The pipe is closed once, under :attr:`_cond`, which every other use of it holds: by the thread as it ends for
    good, or by :meth:`stop` where the thread already ended idle. No write goes to a number another file took since."""

    def __init__(self, linger: float) -> None:
        self.linger = linger
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)  # read only after a select, or drained: never waits
        os.set_blocking(self.write_fd, False)
        self._cond = threading.Condition()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._closed = False  # it takes no new watch (stopped, or a runner of one watch)
        self._open = True  # its pipe
        self._waiting = False  # its thread waits for a watch (not in a watch's slice)
        self._done: Watch | None = None  # the last watch it ran to its end

    def take(self, watch: Watch, prompt: bool = True) -> bool:
        """Run ``watch`` from now (False: it runs another watch that has not ended, or it was stopped). A thread
        that waits for a watch is woken; one still in an ended watch's slice only where ``prompt`` says so, else it
        takes this one at the slice's end (:data:`~nbdist.config.POLL_INTERVAL`, or a signal): a wake-up while
        the cell runs costs it a switch of the interpreter's lock, which here often waits for the next tick."""
        with self._cond:
            if self._closed or not self._idle():
                return False
            self._watch = watch
            if self.linger == 0:
                self._closed = True  # one watch, then it ends
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nbdist-watch", daemon=True)
                self._thread.start()  # the only wait for a new thread: the first watch's, or after a long idle
            elif self._waiting:
                self._cond.notify()
            elif prompt:
                self._write(b"\0")
        return True

    def wake(self) -> None:
        """End the thread's wait in a watch's select: a watch ended, or another was handed over."""
        with self._cond:
            self._write(b"\0")

    def drain(self) -> None:
        """Drop the bytes waiting in the pipe (an ended watch's: the next watch must not read them as its own)."""
        with self._cond:
            if not self._open:
                return
            try:
                while os.read(self.read_fd, 4096):
                    pass
            except OSError:  # BlockingIOError: nothing more waits
                pass

    def stop(self) -> None:
        """It takes no new watch, and its thread ends once the watch it runs has (not waited for)."""
        with self._cond:
            self._closed = True
            if self._thread is None and self._open:  # it ended idle: nobody else closes its pipe
                self._open = False
                os.close(self.read_fd)
                os.close(self.write_fd)
                return
            self._cond.notify()
            self._write(b"\0")

    def _write(self, data: bytes) -> None:
        if not self._open:
            return
        try:
            os.write(self.write_fd, data)
        except OSError:  # BlockingIOError: the pipe is full of wake-ups already; it wakes anyway
            pass

    def _idle(self) -> bool:
        """No watch to run: none handed over, or the one handed over ended (or failed: not run twice)."""
        return self._watch is None or self._watch is self._done or self._watch.ended()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._idle():
                    if self._closed:
                        waited = False
                    else:
                        self._waiting = True
                        waited = self._cond.wait(self.linger)
                        self._waiting = False
                    if self._closed or (not waited and self._idle()):
                        self._thread = None
                        if self._closed:
                            self._open = False
                            os.close(self.read_fd)
                            os.close(self.write_fd)
                        return
                watch = self._watch
            if watch is None:  # not idle: never so
                continue
            try:
                watch.watch(self.read_fd)
            except Exception:  # a watch's failure must not end the thread the next cells' watches run on
                log.exception("nbdist: a cell's watcher failed")
            with self._cond:
                self._done = watch


_SHARED: Runner | None = None
_LOCK = threading.Lock()


def run(watch: Watch, prompt: bool = True) -> Runner:
    """Run ``watch`` on the shared thread, or on one of its own where the shared one runs another watch (``prompt``:
    see :meth:`Runner.take`)."""
    global _SHARED
    with _LOCK:
        if _SHARED is None:
            _SHARED = Runner(LINGER)
        shared = _SHARED
    if shared.take(watch, prompt):
        return shared
    own = Runner(0.0)  # a second watch at once: a thread of its own, for its life
    own.take(watch)
    return own


def stop() -> None:
    """nbdist unloads: the shared thread ends once its watch has (a later watch starts a new one)."""
    global _SHARED
    with _LOCK:
        shared, _SHARED = _SHARED, None
    if shared is not None:
        shared.stop()
