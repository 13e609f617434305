"""The world's numbers in the store: its round, its turns and its generations.

The world is formed in numbered *rounds* (``round``: the current one; :mod:`nbdist.world.rendezvous`), and its
other numbers are kept under its round.

Every step the ranks take together (a ``%%collective``, a ``%dist_barrier``, a
rebuild of the process group for a plain cell's collective) is a numbered
*turn*. The number is the store's (``r/<r>/turn``: the last turn taken), never
a count one rank keeps: a rank reads it at its next step and meets the others
at ``t/<n>`` (:func:`nbdist.world.gather.meet`). A turn is taken when its meeting opens or is
closed, and whoever opens or closes it moves the counter on before saying so.
So a rank whose step was stopped before it began, or that missed steps, meets
the others at the next one, and no stop can put the ranks' numbering out of
step. A follower meets at the number its driver sent, which is the driver's.

The process groups are rebuilt whenever they fail (a rank raised, was
interrupted, died and was replaced): each rebuild is a *generation*, counted in
``r/<r>/gen``; a rank whose group is of an older generation rebuilds it with
the others at its next step that uses it.
"""

from __future__ import annotations

from typing import Protocol

from . import keys
from .store import StoreClient

TURN = keys.TURN  # the last step the world took (see the module docstring)


def current_round(client: StoreClient) -> int:
    """The store's current round (0: none opened yet)."""
    text = client.get_if(keys.ROUND)
    return int(text) if text else 0


def bump_generation(client: StoreClient, key: str, seen: int | None) -> int:
    """Read a generation counter (one round trip); with ``seen``, move it past ``seen`` once."""
    current = client.add(key, 0)  # creates it as "0"
    if seen is not None and current == seen:
        client.compare_set(key, str(seen), str(seen + 1))
    return current


class InRound(Protocol):
    """What a counter reads of its world (:class:`nbdist.world.world.World`): its connection and its round's keys.
    Read at each call: a test may wrap the connection after the world was made."""

    client: StoreClient

    def key(self, name: str) -> str: ...


class Turns:
    """The world's turn counter (``turn`` in its round)."""

    def __init__(self, world: InRound) -> None:
        self._world = world

    def next(self) -> int:
        """The number of the world's next step (one round trip; see the module docstring)."""
        return self._world.client.add(self._world.key(TURN), 0) + 1

    def take(self, n: int) -> None:
        """Move the world past step ``n``; idempotent, and a no-op once the world is past it."""
        self._world.client.compare_set(self._world.key(TURN), str(n - 1), str(n))


class Generations:
    """The world's generation counter (``gen`` in its round)."""

    def __init__(self, world: InRound) -> None:
        self._world = world

    def stored(self) -> int:
        """The store's generation (one round trip): a group of an older one is rebuilt at its next use."""
        return bump_generation(self._world.client, self._world.key(keys.GEN), None)

    def bump(self, seen: int) -> None:
        """Ask every rank to rebuild the process group at its next cell (once per failure)."""
        bump_generation(self._world.client, self._world.key(keys.GEN), seen)
