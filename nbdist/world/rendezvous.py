"""Joining a world and meeting at barriers, over the rendezvous store.

A world is formed in numbered *rounds*. Each rank claims its slot in the
current round; the round is ready when every slot is claimed. Re-running
``%%dist_init`` in a formed world opens the next round, and the others follow
when they re-run theirs; a rank still in the old round learns it at its next
wait. The store's keys: :mod:`nbdist.world.keys`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..config import POLL_INTERVAL
from ..errors import JoinError, WaitTimeout, WorldChangedError
from ..ranksets import ranks_text
from . import keys, records
from .counters import current_round
from .pulse import beat_from
from .records import Registration
from .store import StoreClient
from .world import World, read_ranks

StatusCallback = Callable[[dict[str, Any]], None]


def is_alive(client: StoreClient, session: str, window: float = 2.5) -> bool:
    """Whether a session's heartbeat moves within ``window`` seconds (clock-independent)."""
    return any_alive(client, [session], window)


def join(
    client: StoreClient,
    me: Registration,
    world_size: int,
    timeout: float,
    on_status: StatusCallback | None = None,
    deadline: float | None = None,
) -> World:
    """Claim ``me.rank`` in the current round and wait until every rank has joined.

    ``timeout`` is the --timeout the user gave (named in messages); ``deadline``
    (monotonic) is when to give up, if the join started before this call (the
    elapsed time shown counts from then).

    A slot that holds something other than a registration (anyone can write into the store) is taken as held by
    no one alive: a stale claim, taken over as one whose kernel is gone is.
    """
    rank = me.rank
    session = me.session
    started = time.monotonic() if deadline is None else deadline - timeout
    deadline = started + timeout
    while True:
        r = current_round(client)
        ready = client.check([keys.in_round(r, keys.READY)])
        size = client.compare_set(keys.in_round(r, keys.SIZE), "", str(world_size))
        nonce = uuid.uuid4().hex
        mine = replace(me, nonce=nonce).to_json()
        if ready:
            holder_text = client.get_if(keys.in_round(r, keys.rank(rank)))
            holder = Registration.read(holder_text)
            if holder_text and (holder is None or holder.session != session):
                if holder is not None and is_alive(client, holder.session):
                    raise _duplicate(rank, holder)
                gone = "" if holder is None else holder.session
                if int(size) == world_size and any_alive(client, _claimants(client, r, gone)):
                    world = _replace(client, r, rank, world_size, me, holder_text)
                    if world is not None:
                        return world
                    continue
            # A formed world re-initialised by one of its ranks: open the next round.
            _advance(client, r)
            continue
        claim_text = client.compare_set(keys.in_round(r, keys.rank(rank)), "", mine)
        if client.check([keys.in_round(r, keys.ERROR)]):
            _advance(client, r)  # a failed attempt; start afresh
            continue
        if int(size) != world_size:
            if not any_alive(client, _claimants(client, r, session)):
                _advance(client, r)  # only abandoned claims: start afresh
                continue
            message = (
                f"world sizes disagree: rank {rank} ({me.host}) says --world-size "
                f"{world_size}, but the world being formed has {size}; use the same "
                "--world-size in every notebook"
            )
            client.compare_set(keys.in_round(r, keys.ERROR), "", json.dumps({"message": message}))
            raise JoinError(message)
        claim = Registration.read(claim_text)  # None: not a registration, a claim held by no one alive
        if claim is not None and claim.nonce == nonce:
            client.add(keys.in_round(r, keys.COUNT), 1)
            client.append(keys.in_round(r, keys.JOINED), f"{rank},")
        elif claim is not None and claim.session == session:
            client.set(keys.in_round(r, keys.rank(rank)), mine)  # our own earlier, interrupted attempt
        elif claim is not None and is_alive(client, claim.session):
            raise _duplicate(rank, claim)
        elif client.compare_set(keys.in_round(r, keys.rank(rank)), claim_text, mine) != mine:
            continue  # someone else replaced the stale claim first; look again
        elif claim is None and rank not in _listed(client, r):
            client.add(keys.in_round(r, keys.COUNT), 1)  # a stale claim is counted; what is not one never was
            client.append(keys.in_round(r, keys.JOINED), f"{rank},")
        break
    world = World(client, r, rank, world_size, me)
    world.notes.write("joining")
    try:
        _wait_until_formed(client, world, timeout, deadline, started, on_status)
    except BaseException:
        _withdraw(client, r, rank, session)  # an interrupted or failed join must not count
        raise
    registrations = [keys.in_round(r, keys.rank(i)) for i in range(world_size)]
    world.ranks = read_ranks(client.multi_get(registrations))
    if on_status is not None:
        on_status(_join_status(client, r, world_size, time.monotonic() - started, world.ranks))
    return world


def _replace(
    client: StoreClient, r: int, rank: int, world_size: int, me: Registration, holder_text: str
) -> World | None:
    """Take the slot of a rank that stopped responding in a formed world (its kernel restarted).

    The others keep their round; the process group is rebuilt by every rank
    at the next %%collective (a new generation). None if another notebook
    took the slot first.
    """
    mine = replace(me, nonce=uuid.uuid4().hex).to_json()
    if client.compare_set(keys.in_round(r, keys.rank(rank)), holder_text, mine) != mine:
        return None
    world = World(client, r, rank, world_size, me)
    world.generations.bump(world.generations.stored())
    world.enter_generation(world.generations.stored())
    world.notes.write("rejoined (replacing a rank that stopped responding)")
    world.replaced = Registration.read(holder_text)  # None: the slot held something else
    return world


def _wait_until_formed(
    client: StoreClient,
    world: World,
    timeout: float,
    deadline: float,
    started: float,
    on_status: StatusCallback | None,
) -> None:
    r, world_size = world.round, world.world_size
    last_status = 0.0
    while True:
        error = client.get_if(keys.in_round(r, keys.ERROR))
        if error is not None:
            raise JoinError(records.world_error(error))
        if current_round(client) != r:
            raise WorldChangedError("the world was re-formed while this rank was joining: run %%dist_init again")
        count = client.add(keys.in_round(r, keys.COUNT), 0)
        if count >= world_size:
            client.set(keys.in_round(r, keys.READY), "1")
            break
        now = time.monotonic()
        if on_status is not None and now - last_status >= 0.5:
            last_status = now
            on_status(_join_status(client, r, world_size, now - started))
        if now > deadline:
            status = _join_status(client, r, world_size, now - started)
            raise WaitTimeout(
                f"not every rank joined within --timeout {timeout:g} s; missing {ranks_text(status['missing'])}. "
                "Run %%dist_init in their notebooks, or raise --timeout"
            )
        time.sleep(POLL_INTERVAL)


def _withdraw(client: StoreClient, r: int, rank: int, session: str) -> None:
    """Give back this session's slot in a round that has not formed."""
    if client.check([keys.in_round(r, keys.READY)]):
        return
    key = keys.in_round(r, keys.rank(rank))
    current = client.get_if(key)
    claim = Registration.read(current)
    if current and claim is not None and claim.session == session:
        if client.compare_set(key, current, "") == "":
            client.add(keys.in_round(r, keys.COUNT), -1)


def _advance(client: StoreClient, r: int) -> None:
    """Open round r+1 unless another rank already did."""
    client.compare_set(keys.ROUND, str(r) if r else "", str(r + 1))


def _claimants(client: StoreClient, r: int, exclude: str) -> list[str]:
    sessions = [info.session for info in _joined(client, r).values()]
    return [s for s in sessions if s != exclude]


def any_alive(client: StoreClient, sessions: list[str], window: float = 2.5) -> bool:
    """Whether any of these sessions' heartbeats moves within ``window`` seconds."""
    return bool(alive_sessions(client, sessions, window, first_only=True))


def alive_sessions(client: StoreClient, sessions: list[str], window: float = 2.5,
                   first_only: bool = False) -> set[str]:
    """The sessions whose heartbeats move within ``window`` seconds (and do not say "gone")."""
    first = {s: beat_from(client.get_if(keys.heartbeat(s))) for s in sessions}
    pending = [s for s in sessions if (beat := first[s]) is None or not beat.gone]  # its pulse saw the kernel end
    alive: set[str] = set()
    deadline = time.monotonic() + window
    while pending and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        for s in list(pending):
            now = beat_from(client.get_if(keys.heartbeat(s)))
            if now is None or now.gone:
                continue
            was = first[s]
            if was is None or now.n != was.n:
                alive.add(s)
                pending.remove(s)
                if first_only:
                    return alive
    return alive


def live_peers(client: StoreClient, session: str) -> list[Registration]:
    """Registrations of the current round held by other live sessions that have not left."""
    r = current_round(client)
    claims = {i: info for i, info in _joined(client, r).items()
              if info.session != session and not client.check([keys.in_round(r, keys.left(i))])}
    alive = alive_sessions(client, [info.session for info in claims.values()])
    return [info for info in claims.values() if info.session in alive]


def _duplicate(rank: int, holder: Registration) -> JoinError:
    return JoinError(
        f"rank {rank} is already taken by a notebook on {holder.host} "
        f"(pid {holder.pid}); give this notebook another --rank, or run "
        "%dist_destroy in that notebook first"
    )


def _listed(client: StoreClient, r: int) -> list[int]:
    """The ranks that were counted in as they claimed a slot in round ``r`` (``joined``: each once it claimed)."""
    text = client.get_if(keys.in_round(r, keys.JOINED)) or ""
    return sorted({int(x) for x in text.split(",") if x.strip().isdigit()})


def _joined(client: StoreClient, r: int) -> dict[int, Registration]:
    """Registrations of the ranks that have claimed a slot in round ``r`` (not a withdrawn one, "", nor one that
    holds something else)."""
    present = _listed(client, r)
    found = {i: Registration.read(client.get(keys.in_round(r, keys.rank(i)))) for i in present}
    return {i: info for i, info in found.items() if info is not None}




def _join_status(
    client: StoreClient,
    r: int,
    world_size: int,
    elapsed: float,
    ranks: list[Registration] | None = None,
) -> dict[str, Any]:
    """Who has joined round ``r``, from where (each registration as its JSON object), and who is missing."""
    if ranks is None:
        infos = {i: info.as_dict() for i, info in _joined(client, r).items() if i < world_size}
    else:
        infos = {i: info.as_dict() for i, info in enumerate(ranks)}
    return {
        "round": r,
        "world_size": world_size,
        "joined": infos,
        "missing": [i for i in range(world_size) if i not in infos],
        "elapsed": elapsed,
    }
