"""Virtual time: the clock nbdist's modules read during an explored run, moved only by the scheduler.

The explorer owns its process, so it swaps the ``time`` global of the modules whose clocks a scenario
reaches (:data:`PATCHED`) for a :class:`FakeTime` during each run, and puts the real one back after.
"""

from __future__ import annotations

import contextlib
import importlib
import time as real_time
from collections.abc import Callable, Iterator
from typing import Any

# The modules whose waits and deadlines a scenario reaches. (nbdist.world.store's clock is used only by the waits
# that GatedClient replaces and by connect(), which runs before any run, in real time.)
PATCHED = ("nbdist.world.world", "nbdist.world.notes", "nbdist.world.checks", "nbdist.world.gather",
           "nbdist.world.liveness", "nbdist.world.rendezvous", "nbdist.cell.cells", "nbdist.cell.rebuild")
START = 1000.0  # virtual seconds at the start of a run (monotonic)
EPOCH = 1_800_000_000.0  # what time.time() reads at the start of a run


class VirtualClock:
    """Seconds since an arbitrary start; only :meth:`advance` moves it, and never backwards."""

    def __init__(self) -> None:
        self.now = START

    def reset(self) -> None:
        self.now = START

    def advance(self, to: float) -> None:
        self.now = max(self.now, to)

    @property
    def elapsed(self) -> float:
        """Virtual seconds since the run began."""
        return self.now - START


class FakeTime:
    """What ``time`` reads as inside nbdist during a run: the virtual clock, real formatting.

    ``sleep`` is handed to ``sleeper`` (the scheduler blocks the calling rank in virtual time).
    """

    def __init__(self, clock: VirtualClock, sleeper: Callable[[float], None]) -> None:
        self._clock, self._sleeper = clock, sleeper

    def monotonic(self) -> float:
        return self._clock.now

    perf_counter = monotonic

    def time(self) -> float:
        return EPOCH + self._clock.elapsed

    def sleep(self, seconds: float) -> None:
        self._sleeper(seconds)

    def strftime(self, fmt: str, t: Any = None) -> str:
        return real_time.strftime(fmt, real_time.localtime(self.time()) if t is None else t)

    def localtime(self, seconds: float | None = None) -> real_time.struct_time:
        return real_time.localtime(self.time() if seconds is None else seconds)

    def __getattr__(self, name: str) -> Any:  # anything else (struct_time, gmtime, ...) as the real module has it
        return getattr(real_time, name)


@contextlib.contextmanager
def patched(fake: FakeTime, modules: tuple[str, ...] = PATCHED) -> Iterator[None]:
    """Point each module's ``time`` global at ``fake`` while the block runs."""
    loaded = [importlib.import_module(name) for name in modules]
    saved = [m.time for m in loaded]
    for m in loaded:
        m.time = fake
    try:
        yield
    finally:
        for m, old in zip(loaded, saved, strict=True):
            m.time = old
