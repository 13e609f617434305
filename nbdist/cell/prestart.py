"""The stop button pressed just before a cell starts, or just after it ended: kept out of ipykernel's own code.

ipykernel lets SIGINT raise from the moment it takes a request (its
``pre_handler_hook``) until it has sent the reply (``post_handler_hook``). A
press that lands before IPython's ``pre_run_cell`` event, or after
``post_run_cell``, raises inside ipykernel: it logs "KeyboardInterrupt caught in
kernel" and sends no reply, and nbdist never learns that a ``%%collective``
will not take its step, so the other ranks wait for it until their --timeout.

:class:`Window` takes those two gaps over: there a press is only recorded (in the kernel's
:class:`~nbdist.cell.stops.Stops`). One
recorded before the cell is transformed makes the cell raise KeyboardInterrupt
as its first statement (:meth:`Window.transform`), which is what the press
meant; a ``%%collective`` so stopped closes its step (the session's
``after_cell``). One that lands in the few statements between the
transformation and ``pre_run_cell`` is handed to the cell by :meth:`started`
(``%%collective`` raises it on entry; a plain cell runs). One after the cell
ended has nothing left to stop. Outside ipykernel (a terminal IPython, the
headless follower) there is no such gap and nothing is installed.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from .stops import Stops

log = logging.getLogger(__name__)

RAISE = "raise KeyboardInterrupt  # nbdist: the stop button was pressed before this cell started\n"


class Window:
    """One kernel's guard over the gaps around its cells (see the module docstring); install once per kernel."""

    def __init__(self, stops: Stops) -> None:
        self.stops = stops  # the kernel's stop state: a press in a gap is recorded there (Stops.between)
        self._raised = False  # the cell about to start was turned into a raise of that press
        self._depth = 0  # cells running (a %%dist_init body runs a cell inside the user's)
        self._kernel: Any = None
        self._shell: Any = None

    @property
    def installed(self) -> bool:
        return self._kernel is not None

    def install(self, shell: Any) -> None:
        kernel = getattr(shell, "kernel", None)
        if self._kernel is not None or kernel is None or not hasattr(kernel, "pre_handler_hook"):
            return
        if threading.current_thread() is not threading.main_thread():
            return
        pre, post = kernel.pre_handler_hook, kernel.post_handler_hook  # the kernel's own (bound) hooks

        def pre_handler_hook() -> None:
            pre()  # ipykernel saves its handler and lets SIGINT raise
            self._record_presses()

        def post_handler_hook() -> None:
            self.stops.between, self._raised, self._depth = False, False, 0  # the request is over
            post()

        kernel.pre_handler_hook, kernel.post_handler_hook = pre_handler_hook, post_handler_hook
        self._kernel, self._shell = kernel, shell
        shell.input_transformers_cleanup.append(self.transform)

    def uninstall(self) -> None:
        """Give ipykernel its hooks back (idempotent)."""
        kernel, shell = self._kernel, self._shell
        if kernel is None:
            return
        for name in ("pre_handler_hook", "post_handler_hook"):
            kernel.__dict__.pop(name, None)  # the instance's wrapper; the class's method shows again
        if self.transform in shell.input_transformers_cleanup:
            shell.input_transformers_cleanup.remove(self.transform)
        self._kernel = self._shell = None

    def _record_presses(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.stops.between = True
        log.debug("nbdist: a stop press between cells, handed to the next cell")

    def transform(self, lines: list[str]) -> list[str]:
        """IPython's cleanup transformer: a cell whose stop button was pressed before it started raises at once.

        The press stays recorded until the cell starts: ipykernel transforms a cell once for itself
        (``should_run_async``) before IPython transforms it again to run it.
        """
        if not self.stops.between or self._depth:
            return lines
        self._raised = True
        return [RAISE]

    def started(self) -> bool:
        """A cell starts (``pre_run_cell``): the stop button raises in it again. True if a press that came after
        the cell was transformed waits for it (a %%collective raises it on entry)."""
        self._depth += 1
        if self._depth == 1 and self._kernel is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)
        late = self.stops.between and not self._raised
        self.stops.between = self._raised = False
        return late

    def ended(self) -> None:
        """A cell ended (``post_run_cell``): until ipykernel's reply is out, a press is only recorded."""
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._kernel is not None:
            self._record_presses()
