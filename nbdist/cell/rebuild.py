"""Building this rank's process group, and rebuilding it with every rank when it cannot be trusted.

Every rank builds at the same point (its join, a step's tag), on a prefix of the store every rank
takes alike. A group that was cut (a stopped collective), found broken (a failed cell), destroyed by
the notebook's code, or built in an older generation (a rank rejoined) is rebuilt before it is used:
a ``%%collective`` decides that at its start (:mod:`nbdist.cell.cells`), a plain cell before its first
collective (:func:`ensure`). The notebook's own ``init_process_group`` after its code destroyed the group
builds it again at once, with every rank (:func:`restore`). They work on the kernel's parts that :class:`Parts`
names, not on its session.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backend import envplan
from ..backend.debugmode import DebugMode
from ..backend.procgroup import ProcessGroup, destroy_default
from ..backend.state import BackendState
from ..config import TIMEOUTS
from ..errors import CollectiveMismatchError, InitProcessGroupError, PeerFailedError
from ..world import keys, records
from ..world.link import StoreLink, sync_generation
from ..world.store import run_in_thread
from ..world.world import World, step_name
from . import cells
from .hooks import Collectives
from .step import REBUILD, Claim, Plan, drive
from .turn import Meeting, Turn

BUILT_HCCL = "this kernel has built an HCCL process group already"


@dataclass(frozen=True)
class Parts:
    """What building the process group reads and sets: the kernel's link to its world (its store), its backend
    state, its collectives' hooks (which check against the group) and its cell turn (a rebuild's step)."""

    link: StoreLink
    backend: BackendState
    hooks: Collectives
    turn: Turn


def build(parts: Parts, tag: str, step: int | None = None, also: Callable[[], None] | None = None) -> None:
    """Build this world's process group afresh (every rank does it at the same point).

    ``step``: the step whose meeting opened this rebuild, if any. Every rank arrived there, so every
    rank builds (a stop waits until it has: :mod:`nbdist.cell.turn`); one that cannot publishes its
    failure at that step, and the others' builds end with it instead of waiting in torch's set-up.
    ``also``: a further check while it waits, which may raise to give up.
    """
    world, client, b = parts.link.world, parts.link.client, parts.backend
    assert world is not None and client is not None and b.choice is not None
    old, world.pg, parts.hooks.pg = world.pg, None, None
    if old is not None:
        old.cut("rebuilt")  # nothing may still wait on it, or destroying it would hang
        old.destroy()
    destroy_default()
    # The group's waits in the store (gloo's eager set-up, NCCL's and HCCL's lazy one at the first
    # collective) get the group's timeout: torch sets it on the store only when it makes the store itself.
    store = client.clone(op_timeout=b.pg_timeout).raw()
    backend = b.choice.backend
    if backend == "hccl" and b.npu_seen is None:
        b.npu_seen = {key: os.environ.get(key) for key in envplan.READ_ONCE}
        b.npu_seen_when = BUILT_HCCL
    # One build per step (tag "t<n>") or join: every rank takes the same prefix, whatever generation it read.
    prefix = f"nbdist/r/{world.round}/pg/{tag}/"
    sync_generation(world)
    b.debug.before_build(world, backend, b.environ_for_config())

    def make() -> ProcessGroup:
        return ProcessGroup(backend, store, prefix, world.rank, world.world_size, b.pg_timeout)

    def watch() -> None:
        failed = None if step is None else records.Failure.read(
            world.client.get_if(world.key(keys.failed(step_name(step)))))
        if failed is not None and failed.rank != world.rank:
            raise PeerFailedError(f"rebuilding the process group (step #{step}): {failed.message}; run the next cell "
                                  "on every rank")
        world.checks.peers()
        if also is not None:
            also()

    world.pg = run_in_thread(make, b.pg_timeout, "initialising the process group", on_tick=watch)
    world.pg.gen = world.gen
    parts.hooks.pg = world.pg


def state(debug: DebugMode, world: World, gen: int) -> dict[str, Any]:
    """This rank's process-group state as the others judge it at a step, with the generation it was built in.

    ``gen``: the world's generation now; a group of an older one is not trusted.
    """
    pg = world.pg
    if pg is None:
        return {"ok": False, "why": "it has no process group yet"}
    now = pg.state()
    if now.get("ok") and pg.gen != gen:
        now = {"ok": False, "why": debug.why_moved(world) or "a rank rejoined, or another rank's process "
                                                                     "group failed, since its group was built"}
    return {**now, "gen": pg.gen}


def ensure(parts: Parts) -> str | None:
    """Before a plain cell's first collective: rebuild the process group, with every rank, if it cannot be trusted.

    It cannot when it was cut or found broken (a stopped collective, a failed cell), or when the
    world moved to a new generation since it was built (a rank rejoined, another rank's group
    failed). The rank that finds its own group of this generation broken moves the world on, and
    every rank then rebuilds at a step of its own (a %%collective decides this at its start).
    Returns why it rebuilt, or None.
    """
    world = parts.link.require_world("a collective")
    gen = world.generations.stored()
    pg = world.pg
    if pg is not None and not pg.broken and pg.gen == gen and pg.is_current():
        return None
    if pg is None:
        why = "this rank had no process group yet"
    elif pg.gen != gen:
        why = parts.backend.debug.why_moved(world) or "a rank rejoined, or another rank's process group failed"
    else:
        why = pg.reason if pg.broken else "the notebook's code destroyed the process group"
        world.generations.bump(gen)  # our own group of this generation: tell the others
    def meeting(n: int) -> Meeting:
        announce = _Announcement(world, n, f"nbdist: this cell's first collective waits for every rank to rebuild "
                                           f"the process group ({why})")
        return Meeting("rebuild", f"rebuilding the process group before this cell's collective (step #{n}: {why})",
                       TIMEOUTS["barrier"], on_tick=announce, working=world.notes.busy_elsewhere, on_missed=cells.say)

    # Its own turn (the plain cell that needs it has none); once every rank arrived each builds, then a stop that
    # came meanwhile stops the plain cell.
    drive(Turn(parts.turn.stops), world, Plan(REBUILD, meeting, None, Claim(),
                                              build=lambda n: build(parts, f"t{n}", n), stops_after=True))
    return why


def restore(parts: Parts) -> str | None:
    """The notebook's code asks for a process group (``init_process_group``, :mod:`nbdist.backend.userinit`): if
    that code destroyed the world's, build it again with every rank, where a collective of the same code would
    (a plain cell's first collective; this point of a ``%%collective`` body, which every rank runs alike).
    Returns what was done, in words, or None when the group was there."""
    world = parts.link.require_world("init_process_group")
    if world.pg is not None and world.pg.is_current():
        return None
    checker = parts.hooks.active
    if checker is None or checker.plain:
        on_plain = parts.hooks.on_plain
        if checker is not None or on_plain is None or on_plain() is None:  # a plain cell: as its first collective
            ensure(parts)
        return "the process group, which the notebook's code had destroyed, was built again with every rank"
    if checker.ranks is not None and set(checker.ranks) != set(range(world.world_size)):
        raise InitProcessGroupError("init_process_group after destroy_process_group in a %%collective --ranks cell: "
                                    "the world's process group needs every rank, and the ranks outside --ranks do "
                                    "not run this cell. Run it in a %%collective without --ranks (the next "
                                    "%%collective builds the group again in any case)")
    n = parts.turn.step
    assert n is not None, "a body runs at its step"
    checker.builds += 1
    k = checker.builds
    mine = keys.init_build(step_name(n), k)
    world.client.set(world.key(keys.member(mine, world.rank)), "1")

    def finished_without() -> None:  # a rank that ended its body without this call would leave this one waiting
        for i in range(world.world_size):
            if (i != world.rank and world.client.check([world.key(keys.out(step_name(n), i))])
                    and not world.client.check([world.key(keys.member(mine, i))])):
                raise CollectiveMismatchError(
                    f"{world.describe(i)} finished this cell without building the process group again "
                    f"(init_process_group #{k} after destroy_process_group), which {world.describe(world.rank)} "
                    "waits for: every rank must run the same code")

    with checker.marked(f"init_process_group #{k}"):
        build(parts, f"t{n}i{k}", n, also=finished_without)
    return "the process group, which this cell's code had destroyed, was built again with every rank"


class _Announcement:
    """A plain cell's wait at a step, said once in the cell after a moment: who it waits for, doing what."""

    AFTER = 2.0  # seconds before a wait is worth a line

    def __init__(self, world: World, step: int, what: str) -> None:
        self.world, self.step, self.what = world, step, what
        self.since = time.monotonic()
        self.said = False

    def __call__(self) -> None:
        if self.said or time.monotonic() - self.since < self.AFTER:
            return
        self.said = True
        name, world = keys.arrival(self.step), self.world
        waiting = [f"{world.describe(i)} ({world.notes.doing_as(i, last)})" for i in range(world.world_size)
                   if i != world.rank and ((last := world.notes.of(i)) is None or last.barrier != name)]
        print(f"{self.what}; waiting for {'; '.join(waiting) or 'the others'}. The stop button ends the wait.",
              file=sys.stderr, flush=True)
