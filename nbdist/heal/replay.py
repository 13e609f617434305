"""``%dist_replay``: the earlier cells of the world that called no collective, run again on a restarted rank.

The driving notebook decides (:func:`prepare`, from its :class:`~nbdist.heal.history.History`): which ranks,
which cells on each, and what it cannot bring back. It runs them as one ``%%collective --ranks R`` step whose
body calls :func:`run` on those ranks: each source is transformed as IPython would (magics, ``!``) and run in
the rank's namespace, in order, without a nested cell (IPython's cell events would end the running cell's turn).
The first that raises stops the replay (:class:`~nbdist.errors.ReplayError`).
"""

from __future__ import annotations

import pprint
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import ranksets
from ..errors import ConfigError, ReplayError
from .history import Choice, Entry, History, choose

LISTED = 5  # cells named in one line of what was not replayed; then "and N more"
SYNC = "%dist_sync NAME... --from {rank}"  # the command that copies the rest from a survivor


@dataclass(frozen=True)
class Prepared:
    """What ``%dist_replay`` says (``said``, lines for the driving notebook), the ranks its step runs on (none: no
    step), the step's ``body``, and each chosen rank's restarts, kept once the step succeeded (``answers``)."""

    said: list[str]
    ranks: tuple[int, ...] = ()
    body: str = ""
    answers: dict[int, int] = field(default_factory=dict)


def prepare(history: History, ranks_text: str | None, world_size: int, me: int,
            restarts: Mapping[int, Sequence[float]]) -> Prepared:
    """What ``%dist_replay [--ranks RANKS_TEXT]`` run on rank ``me`` does (``restarts``: each spawned worker's restart
    times, ``time.monotonic()``); raises ConfigError for a --ranks that is not a set of this world's other ranks."""
    if ranks_text is None:
        ranks = history.restarted(restarts)
        if not ranks:
            return Prepared(["nbdist: no worker's kernel was restarted since its last replay: nothing to replay "
                             "(%dist_replay --ranks RANKS replays on those ranks)"])
    else:
        try:
            ranks = ranksets.parse(ranks_text, world_size)
        except ValueError as exc:
            raise ConfigError(f"--ranks: {exc}") from None
        if me in ranks:
            raise ConfigError(f"--ranks: rank {me} is this notebook, whose namespace is its own: replay runs the "
                              "cells on the other ranks")
    survivor = min(set(range(world_size)) - set(ranks))
    choices = [choose(history.entries, r, max(restarts.get(r, ()), default=None)) for r in ranks]
    said = [line for c in choices for line in told(c, survivor)]
    answers = {r: len(restarts.get(r, ())) for r in ranks}
    busy = [c for c in choices if c.replay]
    if not busy:
        return Prepared(said, answers=answers)
    return Prepared(said, tuple(c.rank for c in busy), body(busy), answers)


def told(choice: Choice, survivor: int) -> list[str]:
    """What the driving notebook says of one rank's replay: what runs again, and what does not, and why."""
    on = f"rank {choice.rank}"
    if choice.replay:
        lines = [f"nbdist: replaying on {on}, in order, {_cells(choice.replay, 'that called no collective')}"]
    else:
        lines = [f"nbdist: nothing to replay on {on}: no earlier cell of this world that ran there called no "
                 "collective"]
    if choice.collectives:
        lines.append(f"nbdist: not replayed on {on}: {_cells(choice.collectives, 'with collectives')}; copy the "
                     f"state that came from collectives or training from a survivor: {SYNC.format(rank=survivor)}")
    if choice.elsewhere:
        lines.append(f"nbdist: not replayed on {on}: {_cells(choice.elsewhere, 'that ran on other ranks only')} "
                     "(--ranks)")
    if choice.failed:
        lines.append(f"nbdist: not replayed on {on}: {_cells(choice.failed, 'that failed')}; run again what it needs")
    return lines


def _cells(entries: list[Entry], what: str) -> str:
    """``2 cells with collectives: #2 (…), #5 (…)``."""
    named = ", ".join(e.label() for e in entries[:LISTED])
    more = f", and {len(entries) - LISTED} more" if len(entries) > LISTED else ""
    return f"{len(entries)} {'cell' if len(entries) == 1 else 'cells'} {what}: {named}{more}"


def body(choices: list[Choice]) -> str:
    """The step's body: every chosen rank runs the same text, and picks its own cells from it (:func:`run`)."""
    sources = {e.number: e.source for c in choices for e in c.replay}
    plan = {c.rank: [e.number for e in c.replay] for c in choices}
    return (f"# %dist_replay on {ranksets.ranks_text(plan)}: earlier cells of this world that called no collective\n"
            f"__import__('nbdist.heal.replay', fromlist=['run']).run(\n    get_ipython(),\n"
            f"    {pprint.pformat(plan, width=100)},\n    {pprint.pformat(sources, width=100)},\n)\n")


def run(shell: Any, plan: Mapping[int, Sequence[int]], sources: Mapping[int, str], rank: int | None = None) -> None:
    """On a rank of the replay's step: run this rank's cells of ``plan`` (rank -> cell numbers) from ``sources``
    (number -> body) in its namespace, in order, printing which; raise ReplayError at the first that raises.
    ``rank``: this rank (default: torch.distributed's)."""
    if rank is None:
        import torch.distributed as dist

        rank = dist.get_rank()
    numbers = plan.get(rank, [])
    for n in numbers:
        e = Entry(n, sources[n], 0, None, False, 0.0)
        print(f"nbdist: replaying %%collective {e.label()}", flush=True)
        try:
            code = compile(shell.transform_cell(e.source), f"<%%collective #{n}, replayed>", "exec")
            exec(code, shell.user_ns)  # noqa: S102 (the notebook's own cell, run again)
        except Exception as exc:
            rest = numbers[numbers.index(n) + 1:]
            after = f"; not run: {', '.join(f'#{m}' for m in rest)}" if rest else ""
            raise ReplayError(f"replaying %%collective {e.label()} raised {type(exc).__name__}: {exc}{after}") from exc
    print(f"nbdist: replayed {len(numbers)} cell{'' if len(numbers) == 1 else 's'}", flush=True)


# --- in peer notebooks: the survivors' record of the cells, sent to the ranks whose kernel is new ----------------

SHARED = "__import__('nbdist.healmagics', fromlist=['replay_here']).replay_here(get_ipython())\n"


def shared(shell: Any, entries: Sequence[Entry], joined_after: int | None) -> bool:
    """On every rank of a peer world, in one ``%%collective`` (:data:`SHARED`, the same text everywhere): the ranks
    whose kernel took over a slot (``joined_after``: the last step before it joined; None on a survivor) get the
    lowest survivor's record of the cells (``entries``), and each runs again those of them that ended before it
    joined and called no collective, as :func:`run`. Only small JSON and the cells' text travel, over the process
    group. Returns whether this rank replayed."""
    import json

    import torch.distributed as dist

    from ..gathered import gathered
    from .sync import broadcast_bytes, device

    rank, here = dist.get_rank(), device(shell.user_ns, dist.get_backend())
    new = [r for r, said in enumerate(gathered(json.dumps(joined_after), here)) if json.loads(said) is not None]
    survivors = sorted(set(range(dist.get_world_size())) - set(new))
    if not new or not survivors:
        print("nbdist: no rank's kernel took over its slot in this world: nothing to replay" if not new else
              "nbdist: every rank's kernel is new: no rank holds the record of the earlier cells")
        return False
    source = survivors[0]
    record = broadcast_bytes(json.dumps([_as_json(e) for e in entries]).encode() if rank == source else None,
                             source, here)
    if joined_after is None:
        if rank == source:
            print(f"nbdist: sent this notebook's record of {len(entries)} cells to {ranksets.ranks_text(new)}")
        return False
    before = [e for e in map(_from_json, json.loads(record)) if e.number <= joined_after]
    choice = choose(before, rank, None)
    print("\n".join(told(choice, source)), flush=True)
    if choice.replay:
        run(shell, {rank: [e.number for e in choice.replay]}, {e.number: e.source for e in choice.replay}, rank)
    return True


def _as_json(e: Entry) -> list[Any]:
    return [e.number, e.source, e.collectives, None if e.ranks is None else list(e.ranks), e.failed]


def _from_json(v: list[Any]) -> Entry:
    number, source, collectives, ranks, failed = v
    return Entry(number, source, collectives, None if ranks is None else tuple(ranks), failed, 0.0)
