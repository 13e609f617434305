"""The process group's set-up, modelled at the store, so the explorer can rebuild it between the ranks' operations.

nbdist's rebuild (:func:`nbdist.cell.rebuild.build`) runs torch's set-up in a thread and watches the step
and the peers while it waits. torch's set-up is a rendezvous on a store prefix that every rank of the group
takes alike: each rank arrives, and none finishes before every rank has arrived (gloo's pairs, NCCL's and
HCCL's unique id); a rank that arrived and left still counts (its set-up goes on in the thread it started).
Here that rendezvous is one count and one wait through the rank's gated client, the wait ticking the
rebuild's own watch as the real one does, with the group's timeout: a rank whose build can never finish
waits past :data:`~.scheduler.HANG_AFTER`, and the run ends it as hung.

:func:`modelled` swaps the model in for torch's group and the thread that waits for it; each build is
recorded (its rank and prefix) so a check can see that the ranks built alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nbdist.cell import rebuild

from .kernel import Trusted


@dataclass
class Builds:
    """Every build of a run: (rank, prefix) in the order they finished, and the ones that never did."""

    done: list[tuple[int, str]] = field(default_factory=list)
    started: list[tuple[int, str]] = field(default_factory=list)

    def prefixes(self, rank: int) -> list[str]:
        return [prefix for r, prefix in self.done if r == rank]


BUILDS = Builds()


class ModelGroup(Trusted):
    """A process group whose set-up is a rendezvous on ``prefix`` (see the module docstring)."""

    def __init__(self, backend: str, store: Any, prefix: str, rank: int, world_size: int, timeout: float) -> None:
        super().__init__(gen=0)  # rebuild.build sets its generation once built
        self.store, self.prefix, self.rank, self.world_size, self.timeout = store, prefix, rank, world_size, timeout

    def set_up(self, on_tick: Callable[[], None] | None) -> ModelGroup:
        """Arrive, and wait until every rank has (the rebuild's watch ticking): what torch's set-up does."""
        BUILDS.started.append((self.rank, self.prefix))
        if self.store.add(f"{self.prefix}n", 1) >= self.world_size:
            self.store.set(f"{self.prefix}all", "1")
        self.store.wait([f"{self.prefix}all"], self.timeout, on_tick=on_tick)
        BUILDS.done.append((self.rank, self.prefix))
        return self


def _set_up_in_place(make: Callable[[], Any], seconds: float, what: str,
                     on_tick: Callable[[], None] | None = None) -> Any:
    """:func:`nbdist.world.store.run_in_thread` for a group's set-up: the rank's own thread waits, ticking."""
    group = make()
    assert isinstance(group, ModelGroup), what
    return group.set_up(on_tick)


class Link:
    """A session's link to the store for a rebuild: the rank's gated client itself (the rebuild clones it)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def clone(self, op_timeout: float = 10.0) -> Link:
        return self

    def raw(self) -> Any:
        return self.client


@contextlib.contextmanager
def modelled() -> Iterator[Builds]:
    """Rebuilds set up :class:`ModelGroup` for the block; yields the run's builds."""
    saved = rebuild.ProcessGroup, rebuild.run_in_thread, rebuild.destroy_default
    BUILDS.done.clear()
    BUILDS.started.clear()
    rebuild.ProcessGroup, rebuild.run_in_thread = ModelGroup, _set_up_in_place  # type: ignore[assignment,misc]
    rebuild.destroy_default = lambda: None
    try:
        yield BUILDS
    finally:
        rebuild.ProcessGroup, rebuild.run_in_thread, rebuild.destroy_default = saved
