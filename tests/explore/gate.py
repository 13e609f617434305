"""A store client whose every operation waits at the scheduler's gate first (one per simulated rank).

Reads and writes go to the real ``TCPStore``, once the scheduler grants them. A wait does not block in the
store: the rank tells the scheduler which keys it waits for, and the scheduler wakes it when they are set, or
moves virtual time to its next tick (``on_tick`` runs, as in :meth:`StoreClient.wait`) and past its deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbdist.config import POLL_INTERVAL
from nbdist.errors import WaitTimeout
from nbdist.world.store import PREFIX, StoreClient

if TYPE_CHECKING:
    from .scheduler import Scheduler

# torch's TCPStore sends these without waiting for the server's answer: another client (the scheduler, which wakes
# the ranks waiting for the key) could look before the server has stored it, and the run would depend on timing.
UNANSWERED = frozenset({"set", "append"})
TICK = POLL_INTERVAL  # virtual seconds between a wait's ticks, as StoreClient.wait slices its waits


class Killed(BaseException):
    """The rank's kernel was killed: nothing more of it reaches the store (no handler catches this)."""


class Hung(BaseException):
    """The rank's wait would never end (it outlasted :data:`~.scheduler.HANG_AFTER`): the run ends it with this."""


class GatedClient(StoreClient):
    """One rank's connection, gated by the scheduler; ``clone`` gives another one of the same rank."""

    def __init__(self, base: StoreClient, rank: int, scheduler: Scheduler) -> None:
        super().__init__(base.host, base.port, base.raw())
        self.rank, self.scheduler = rank, scheduler
        self._label: tuple[str, str, tuple[Any, ...]] | None = None  # the public operation under way

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        op, key, args = self._label or (what, "", ())

        def call() -> Any:
            out = StoreClient._call(self, what, fn)
            if what in UNANSWERED:  # done once the server answers a later request on this connection
                self.raw().check([PREFIX + key])
            return out

        return self.scheduler.operate(self.rank, op, key, args, call)

    def clone(self, op_timeout: float = 10.0) -> GatedClient:
        return GatedClient(StoreClient.clone(self, op_timeout), self.rank, self.scheduler)

    def wait(self, keys: Sequence[str], seconds: float, on_tick: Callable[[], None] | None = None) -> None:
        """Block in virtual time until ``keys`` are set; every :data:`TICK` run ``on_tick``; past ``seconds``, raise
        :class:`WaitTimeout` as the real wait does."""
        scheduler = self.scheduler
        after = scheduler.enter_wait(self.rank, list(keys))
        start = scheduler.clock.now
        deadline, ticks, how = start + seconds, 0, "raised"
        try:
            while True:
                ticks += 1
                if scheduler.block(self.rank, list(keys), until=start + ticks * TICK) == "ready":
                    how = "ready"
                    break
                if on_tick is not None:
                    with scheduler.ticking(self.rank):
                        on_tick()
                if scheduler.clock.now > deadline:
                    how = "timeout"
                    raise WaitTimeout(f"waited {seconds:g} s for {', '.join(keys)}")
        finally:
            scheduler.left_wait(self.rank, list(keys), start, seconds, how)
        if after is not None:
            scheduler.land(self.rank, after)


def _labelled(name: str) -> Callable[..., Any]:
    """StoreClient's operation ``name``, telling the gate its name and key (``_call`` sees neither)."""
    base = getattr(StoreClient, name)

    def operation(self: GatedClient, key: Any, *args: Any) -> Any:
        if self._label is not None:  # get_if's own compare_set: the gate already knows it as get_if
            return base(self, key, *args)
        self._label = (name, key if isinstance(key, str) else ",".join(key), args)
        try:
            return base(self, key, *args)
        finally:
            self._label = None

    operation.__name__ = operation.__qualname__ = name
    return operation


for _name in ("set", "get", "get_if", "multi_get", "check", "add", "compare_set", "delete", "append"):
    setattr(GatedClient, _name, _labelled(_name))
