"""What a ``%%collective`` cell's debugging takes from its kernel: breakpoints in its body
(:mod:`nbdist.debug.breakpoints`), and where every rank was if it hangs (:mod:`nbdist.debug.hangs`)."""

from __future__ import annotations

from collections.abc import Callable

from ..world.world import World
from . import hangs
from .breakpoints import Breakpoints


class Aids:
    """One kernel's debugging aids, for its lifetime."""

    def __init__(self, secret: Callable[[], str], pg_timeout: Callable[[], float]) -> None:
        self.secret = secret
        self.breakpoints = Breakpoints(secret, pg_timeout)

    def hang(self, world: World, asks: bool) -> hangs.Hang | None:
        """This cell's hang report, where this rank ``asks`` (a rank with a notebook: not a follower)."""
        return hangs.Hang(world, lambda: self.breakpoints.key_for(world)) if asks else None
