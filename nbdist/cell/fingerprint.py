"""Collective fingerprints: each collective a %%collective body issues is compared across ranks first.

While a body runs, every call of a ``torch.distributed`` collective reaches the
cell's :class:`Checker` (through :mod:`nbdist.cell.hooks`). A checked call publishes
its fingerprint (op, shapes, dtypes, device types, root, reduce op) and waits
until every member of its group has published the same sequence number. The
last member to arrive compares them (one read, by one rank); if a field differs,
it refuses the meeting, every member raises :class:`CollectiveMismatchError`
naming the ranks and the field, and nothing is sent. Point-to-point calls
(send/recv) involve two ranks only and are not compared.

In a ``%%collective --ranks`` cell the checker knows the cell's member ranks:
a call that would wait for a rank that skips the cell (a collective on a group
with such a member, a send or recv with such a peer) is refused before it
runs, compared or not (``--no-check``), since that rank never calls it.

The checker also knows whether the body is inside a collective right now (the
watcher cuts only then), and refuses to start a collective once the cell has
been stopped: a cut group would fail it at once, and a collective that started
after the stop could wait for ever.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from ..backend.procgroup import group_name, members
from ..errors import CollectiveMismatchError, PeerFailedError, PeerLostError, SkippedRanksError, StoppedError
from ..ranksets import fold, ranks_text, who_said
from ..world import gather, keys, records
from ..world import verdict as verdicts
from ..world.capture_record import Capture
from ..world.gather import BarrierRefused, Gathering
from ..world.store import StoreClient
from ..world.verdict import Verdict
from ..world.world import World
from .history import History, checksum, end_mismatch, quick_key, summary

# op name -> names of its tensor arguments
OPS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("tensor",),
    "broadcast": ("tensor",),
    "reduce": ("tensor",),
    "all_gather": ("tensor_list", "tensor"),
    "all_gather_into_tensor": ("output_tensor", "input_tensor"),
    "gather": ("tensor", "gather_list"),
    "scatter": ("tensor", "scatter_list"),
    "reduce_scatter": ("output", "input_list"),
    "reduce_scatter_tensor": ("output", "input"),
    "all_to_all": ("output_tensor_list", "input_tensor_list"),
    "all_to_all_single": ("output", "input"),
    "barrier": (),
    "all_gather_object": (),
    "broadcast_object_list": (),
}
# Arguments that name a root, compared as they are.
ROOTS = ("src", "dst", "group_src", "group_dst")
# Lists whose content only the root provides: not compared.
ROOT_ONLY = {"gather_list", "scatter_list"}

# What a collective says when a peer's end of its connections closed (a dead or cut peer).
CUT_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
REASON_WAIT = 8.0  # seconds a plain cell's broken collective waits for the watcher to name the cause
WAIT_SLICE = timedelta(milliseconds=100)  # longest a body waits in C for a gloo collective at a time
ABANDON_AFTER = 0.5  # seconds a collective may outlive the cut of its group before it is left behind
MAX_EVENTS = 20_000  # --trace: calls recorded per rank and cell


def _describe(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch."),
                "device": value.device.type}
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value]
    return None if value is None else repr(value)


def fingerprint(op: str, params: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What must match across ranks for this call to be the same collective (``params``: the op's parameters)."""
    bound = dict(zip(params, args, strict=False))
    bound.update(kwargs)
    fp: dict[str, Any] = {"op": op}
    for name in OPS[op]:
        if name in bound and name not in ROOT_ONLY:
            fp[name] = _describe(bound[name])
    for root in ROOTS:
        if bound.get(root) is not None:
            fp[root] = bound[root]
    if "op" in params:
        fp["reduce_op"] = str(bound.get("op", "SUM"))
    if op in ("all_gather_object", "broadcast_object_list") and bound.get("object_list") is not None:
        fp["object_list"] = f"{len(bound['object_list'])} object(s)"
    return fp


# --- readable differences ---------------------------------------------------------
def _tensor_text(desc: Any, keys: list[str]) -> str:
    if isinstance(desc, dict):
        return ", ".join(f"{k} {desc[k]}" for k in keys if k in desc)
    if isinstance(desc, list):
        return f"{len(desc)} tensor(s)"
    return str(desc)


def _varying(values: list[Any]) -> list[str]:
    """Which of shape/dtype/device differ among tensor descriptions (all of them when they are not alike)."""
    if all(isinstance(v, dict) for v in values):
        return [k for k in ("shape", "dtype", "device") if len({json.dumps(v.get(k)) for v in values}) > 1]
    return ["shape", "dtype", "device"]


def _field_text(values: list[Any]) -> list[str]:
    """Each rank's value of one differing field, in words."""
    if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
        parts: list[list[str]] = [[] for _ in values]
        for i in range(len(values[0])):
            column = [v[i] for v in values]
            if len({json.dumps(c) for c in column}) > 1:
                keys = _varying(column)
                for p, c in zip(parts, column, strict=True):
                    p.append(f"[{i}] {_tensor_text(c, keys)}")
        return ["; ".join(p) for p in parts]
    if any(isinstance(v, dict | list) for v in values):
        keys = _varying(values)
        return [_tensor_text(v, keys) for v in values]
    return ["(absent)" if v is None else str(v) for v in values]


@dataclass(frozen=True)
class Fingerprint:
    """A rank's fingerprint of one collective (``t/<n>/.../<rank>`` under :func:`.keys.compared`), for the others to
    compare: its ``op``, its number among the group's calls (``seq``), and what else must match (``params``, by name,
    as :func:`fingerprint` reads them: JSON values of any kind). Its JSON: ``{"op", **params, "seq"}``."""

    op: str
    seq: int
    params: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, **self.params, "seq": self.seq}

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str | None) -> Fingerprint:
        value = records.json_object(text)
        read = records.Fields(value)
        return cls(op=read.text("op"), seq=read.count("seq"),
                   params={k: v for k, v in value.items() if k not in ("op", "seq")})

    @classmethod
    def read(cls, text: str | None) -> dict[str, Any] | None:
        """A member's fingerprint as its JSON object, or None: not published yet, or not a fingerprint (anyone can
        write there: left out of the comparison, as one not in yet is)."""
        fp = records.or_none(cls.from_json, text)
        return None if fp is None else fp.as_dict()


def differences(fps: dict[int, dict[str, Any]]) -> list[str]:
    """Fields that differ between ranks, each naming which ranks had which value, in words."""
    problems = []
    ranks = sorted(fps)
    for name in sorted({k for fp in fps.values() for k in fp}):
        values = [fps[r].get(name) for r in ranks]
        if len({json.dumps(v) for v in values}) == 1:
            continue
        texts = _field_text(values)
        groups: dict[str, list[int]] = {}
        for rank, text in zip(ranks, texts, strict=True):
            groups.setdefault(text, []).append(rank)
        problems.append(f"{name} differs ({who_said(groups)})")
    return problems


_T = TypeVar("_T")


class Published(Generic[_T]):
    """Keys the ranks publish once each and then count (one ``add`` on a count), read at one operation a look.

    A look reads the count; only when it moved since the last look does it read the keys of the ranks not
    found yet (a rank's key, once set, is not set again). A rank counts itself after it published its key,
    so the look after its count finds it: a waiting rank reads one number per tick, and the keys once each
    time a rank comes in, whatever the world's size (issue 34, item 6).
    """

    def __init__(self, count: str, key: Callable[[int], str], read: Callable[[str | None], _T | None]) -> None:
        self._count, self._key = count, key  # both as the store client takes them (in the world's round)
        self._read = read  # a key's text (None: unset) as its value; None: unset, or not the record (anyone's text)
        self._seen = 0
        self.found: dict[int, _T] = {}  # rank -> its published value, as read

    def look(self, client: StoreClient, ranks: Iterable[int]) -> dict[int, _T]:
        """What ``ranks`` published, as far as the count says any did; every value found so far."""
        n = client.add(self._count, 0)
        if n != self._seen:
            self._seen = n
            for i in ranks:
                if i not in self.found:
                    value = self._read(client.get_if(self._key(i)))
                    if value is not None:
                        self.found[i] = value
        return self.found


def ended(world: World, cell: str) -> Published[Capture]:
    """The ranks' records at ``cell``'s end (:func:`nbdist.world.keys.out`), by the count of those that ended it."""
    return Published(world.key(keys.ended(cell)), lambda i: world.key(keys.out(cell, i)), Capture.read)


class Checker:
    """One cell's view of its collectives: compares each across the group's members, knows when it is inside one."""

    def __init__(self, world: World, cell: str, timeout: float, params: dict[str, list[str]], compare: bool = True,
                 on_tick: Callable[[], None] | None = None, plain: bool = False, trace: bool = False,
                 ranks: tuple[int, ...] | None = None,
                 compare_at: Callable[[World, Gathering], Verdict] = gather.barrier) -> None:
        self.world, self.cell, self.timeout, self.params = world, cell, timeout, params
        self.compare_at = compare_at  # how a comparison meets the others: in a %%collective, its turn's (Turn.compare)
        self.compare = compare
        self.ranks = ranks  # the cell's members (--ranks; None: every rank)
        self.known: dict[Any, int] = {}  # quick key -> checksum of its fingerprint, for kinds of call seen
        self.sigs: dict[int, dict[str, Any]] = {}  # checksum -> fingerprint
        self.histories: dict[str, History] = {}  # group name -> what was issued on it (when compared)
        # --trace: (group, number, op, checksum, entered, left) per call, seconds from here (the start barrier)
        self.events: list[tuple[Any, ...]] | None = [] if trace else None
        self.origin = time.perf_counter()
        self._names: dict[Any, str] = {}  # a group (None: the default one) -> torch's name of it, for this cell
        import torch  # a cell runs in a joined world: torch is imported

        self._tensor = torch.Tensor
        self.plain = plain  # a plain cell's: nothing to compare; a stopped collective raises why it stopped
        self.on_tick = on_tick
        self.counts: dict[str, int] = {}  # group name -> collectives issued in this cell
        self.inside: tuple[str, float] | None = None  # (what, since) while a collective runs
        self.reaching: tuple[str, float] | None = None  # (what, since) while it waits to compare one with the others
        self.stopped: records.Failure | None = None  # set by the watcher: why no collective may start
        self.failed_inside = False
        self.builds = 0  # process groups the body's init_process_group built after destroying the world's (rebuild)
        self.lock = threading.Lock()
        self._ended = ended(world, cell)  # the ranks that ended the body, as a waiting collective looks
        self._late: tuple[str, Published[dict[str, Any]]] | None = None  # a late comparison: its meeting, prints

    def stop(self, failure: records.Failure) -> None:
        """No collective may start from now on (one already running is the watcher's to cut)."""
        with self.lock:
            if self.stopped is None:
                self.stopped = failure

    def call(self, op: str, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             p2p: bool = False) -> Any:
        """Run one collective of the body: refuse if the cell was stopped, check it, mark it as running."""
        group = group_arg(self.params[op], args, kwargs)
        ranks = members(group)
        if ranks is not None and self.world.rank not in ranks:
            return original(*args, **kwargs)  # torch returns at once for a non-member
        if self.ranks is not None:
            self._refuse_skipped(op, args, kwargs, ranks, p2p)
        self._refuse_if_stopped()
        what, late = op, None
        crc = name = n = None
        if not p2p:
            name = self._names.get(group)
            if name is None:
                name = self._names[group] = group_name(group)
            n = self.counts.get(name, 0) + 1
            if self.compare or self.events is not None:
                self.reaching = (f"collective #{n} ({op})", time.monotonic())  # compared first: the others' turn
                try:
                    crc, agreed = self._kind(op, args, kwargs, name, n, ranks)
                finally:
                    self.reaching = None
                if self.compare:
                    hist = self.histories.get(name)
                    if hist is None:
                        hist = self.histories[name] = History()
                    hist.add(crc)
                    if not agreed:
                        late = (name, n, crc, ranks)
            self.counts[name] = n
            what = f"collective #{n} ({op})"
        with self.lock:
            self._refuse_if_stopped()
            self.inside = (what, time.monotonic())
        pg = self.world.pg
        if pg is not None:
            pg.count(group, p2p)
        started = time.perf_counter() if self.events is not None else 0.0
        try:
            if pg is None or pg.backend != "gloo" or not self._can_wait_here(op, args, kwargs):
                return original(*args, **kwargs)
            self._wait(pg, original(*args, **{**kwargs, "async_op": True}), late)
            return None
        except BaseException as exc:
            if not isinstance(exc, Exception) and not self.plain:
                raise
            self.failed_inside = True  # a collective that failed: the group may be broken
            if self.plain:
                if pg is not None:  # nothing counts a plain cell's collectives across ranks: rebuild at the next
                    pg.distrust(f"a collective of a plain cell ended early ({type(exc).__name__})")
                if isinstance(exc, Exception) and self._reason_follows(exc):
                    raise self._why_stopped() from exc
            raise
        finally:
            self.inside = None
            if self.events is not None and len(self.events) < MAX_EVENTS:
                self.events.append((name, n, op, crc, started - self.origin, time.perf_counter() - self.origin))

    def _kind(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, n: int,
              ranks: list[int] | None) -> tuple[int, bool]:
        """This call's checksum, and whether it was compared before running (the first of its kind, when checked).
        Object collectives are always compared first: their key would be their objects."""
        key = None if "object" in op else (name, quick_key(op, args, kwargs, self._tensor))
        crc = self.known.get(key) if key is not None else None
        if crc is not None:
            return crc, False
        fp = fingerprint(op, self.params[op], args, kwargs)
        crc = checksum(fp)
        self.sigs.setdefault(crc, fp)
        if self.compare:
            self.agree(fp, name, n, ranks)
        if key is not None:
            self.known[key] = crc
        return crc, self.compare

    def _refuse_skipped(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], ranks: list[int] | None,
                        p2p: bool) -> None:
        """Refuse a call that would wait for ranks outside the cell's ``--ranks`` (they never make it)."""
        assert self.ranks is not None
        world_size = self.world.world_size
        waits = [peer_of(self.params[op], args, kwargs, ranks)] if p2p else ranks or range(world_size)
        outside = sorted({r for r in waits if r is not None and r not in self.ranks})
        if outside:
            raise SkippedRanksError(skipped_message(op, ranks, outside, self.ranks, world_size, p2p))

    def checks(self) -> dict[str, Any]:
        """What this rank publishes at the end of the body so that the ranks compare their collectives."""
        return summary(self.histories, self.sigs)

    def call_own(self, name: str, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a collective that torch's own code starts from C++ (DDP's constructor): refused if the cell was
        stopped, marked as inside while it runs (the watcher cuts it at a stop), not compared."""
        with self.lock:
            self._refuse_if_stopped()
            self.inside = (f"{name} (torch's own collective)", time.monotonic())
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            self.failed_inside = True
            pg = self.world.pg
            if pg is not None:  # torch counted it, nbdist did not: the ranks rebuild at the next use
                pg.distrust(f"torch's own collective {name} ended early ({type(exc).__name__})")
            if self.plain and self._reason_follows(exc):
                raise self._why_stopped() from exc
            raise
        finally:
            self.inside = None

    @contextlib.contextmanager
    def marked(self, what: str) -> Iterator[None]:
        """Mark the body as inside ``what`` while it calls collectives nbdist does not wrap (%dist_bench's)."""
        with self.lock:
            self.inside = (what, time.monotonic())
        try:
            yield
        finally:
            self.inside = None

    def _can_wait_here(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether nbdist may run this call as async_op and wait for it itself (a blocking call the user made)."""
        params = self.params[op]
        if "async_op" not in params or params.index("async_op") < len(args):
            return False  # no such argument, or given positionally: the call stays as it is
        return not kwargs.get("async_op", False)

    def _wait(self, pg: Any, work: Any, late: tuple[str, int, int, list[int] | None] | None = None) -> None:
        """Wait for a gloo collective in slices, so that a stopped cell never waits on one for long.

        The watcher cuts the group when the cell is stopped, which fails the
        collective at once. Gloo can lose one, though (a send that was under
        way when its connection broke is never failed, and waits for the full
        timeout: gloo/transport/tcp/pair.cc): such a collective is left behind,
        and the group, which would wait for it when destroyed, is set aside.

        ``late``: a call that was not compared before it ran (its kind was seen
        before): once it outlasts a slice, it is compared while it waits
        (:meth:`_compare_late`), since the ranks may be waiting in different ones.
        """
        if work is None:
            return
        stopped_at: float | None = None
        published = False
        while True:
            try:
                work.wait(WAIT_SLICE)
                return
            except RuntimeError:
                if work.is_completed():  # it failed, or it completed just after this slice ran out: ask again
                    try:
                        work.wait(WAIT_SLICE)
                        return
                    except RuntimeError as exc:
                        if late is not None and self.stopped is None:
                            self._compare_late(*late, publish=not published)  # a rank that found a mismatch cut it
                        raise exc from None
            if late is not None and self.stopped is None:
                try:
                    self._compare_late(*late, publish=not published)
                except CollectiveMismatchError as exc:
                    # This rank's call is pending and the others will not join it: fail it (on every rank, so
                    # that no gloo thread keeps waiting, which would block the group's destruction) and set it aside.
                    pg.cut(f"collectives did not match: {exc}")
                    pg.abandon()
                    raise
                published = True
            if self.stopped is not None:
                stopped_at = stopped_at or time.monotonic()
                if time.monotonic() - stopped_at > ABANDON_AFTER:
                    pg.abandon()
                    self._refuse_if_stopped()
            elif self.world.attend is not None:  # a driven rank's debugger, while this one waits
                self.world.attend()

    def _compare_late(self, name: str, seq: int, crc: int, ranks: list[int] | None, publish: bool) -> None:
        """A slow call of a kind seen before: publish its fingerprint as :meth:`agree` does, compare what is there.

        Joining the barrier of :meth:`agree` lets a rank that waits there for this
        call (its own call was new to it) go on and compare.
        """
        world, client = self.world, self.world.client
        fp = {**self.sigs[crc], "seq": seq}
        base = keys.compared(self.cell, name, seq)
        if publish:
            client.set_json(world.key(keys.member(base, world.rank)), fp)
            client.add(world.key(keys.arrivals(base)), 1)
        who = ranks if ranks is not None else list(range(world.world_size))
        others = [i for i in who if i != world.rank]
        if self._late is None or self._late[0] != base:
            self._late = (base, Published(world.key(keys.arrivals(base)), lambda i: world.key(keys.member(base, i)),
                                             Fingerprint.read))
        theirs = self._late[1].look(client, others)
        fps = {world.rank: fp, **{i: theirs[i] for i in others if i in theirs}}
        problems = differences(fps)
        if problems:
            raise CollectiveMismatchError(
                f"collective #{seq} ({fp['op']}) of this cell does not match across ranks: {'; '.join(problems)}. "
                "The ranks waited in different collectives; fix the cell so every rank issues the same collectives"
            )
        self._peer_finished(name, seq, fp, ranks)  # it looks at who ended the body: read below as it found them
        for i in who:  # a rank whose own call completed (gloo may complete one side of a mismatch) and finished
            done = self._ended.found.get(i) if i != world.rank else None
            if done is not None and done.checks is not None:
                mine = self.checks()
                why = end_mismatch({world.rank: mine, i: done.checks}, differences)
                if why is not None:
                    raise CollectiveMismatchError(why.replace(
                        "It ran, so its results may be wrong", "It completed on some ranks (their results may be "
                        f"wrong) and {world.describe(world.rank)} waited in it"))

    def _reason_follows(self, exc: Exception) -> bool:
        """Whether this plain cell's collective failed for a reason the watcher knows or soon will.

        A peer that died, or cut its group for a stop of every rank, closes the connections at
        once, before this rank's watcher sees why: give it a moment, so the error names the cause.
        """
        if self.stopped is None and any(sign in str(exc) for sign in CUT_SIGNS):
            deadline = time.monotonic() + REASON_WAIT
            while self.stopped is None and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.stopped is not None

    def _refuse_if_stopped(self) -> None:
        if self.stopped is not None:
            raise self._why_stopped(started=False)

    def _why_stopped(self, started: bool = True) -> BaseException:
        """The error a collective of a stopped cell raises: the stop button's, a lost peer's, a stop of all."""
        stopped = self.stopped or records.Failure(records.WORLD, "stopped", "the cell was stopped")
        kind, message = stopped.kind, stopped.message
        if kind == "interrupted" and stopped.rank == self.world.rank:
            return KeyboardInterrupt()
        if kind == "stopped":
            return StoppedError(message)
        if kind == "lost":
            return PeerLostError(message)
        return PeerFailedError(f"{message}; this collective was {'stopped' if started else 'not started'}")

    def agree(self, fp: dict[str, Any], name: str, seq: int, ranks: list[int] | None) -> None:
        """Publish this rank's fingerprint for collective ``seq`` of group ``name``; the last member to arrive
        compares every member's, and refuses the meeting with what differs (every member raises it)."""
        world, client = self.world, self.world.client
        fp = {**fp, "seq": seq}
        base = keys.compared(self.cell, name, seq)
        client.set_json(world.key(keys.member(base, world.rank)), fp)
        label = f"collective #{seq} ({fp['op']}) of this cell"
        who = ranks if ranks is not None else list(range(world.world_size))

        def compare() -> Verdict:  # every member's fingerprint is in: they published it before they arrived
            texts = client.multi_get([world.key(keys.member(base, i)) for i in who])
            fps = {i: Fingerprint.read(t) for i, t in zip(who, texts, strict=True)}
            problems = differences({i: fp for i, fp in fps.items() if fp is not None})
            return verdicts.refused("; ".join(problems)) if problems else verdicts.GO

        # --timeout counts only for members not at work in the body: one still computing is waited for while
        # it lives (it may be minutes from its collective); one that finished without it is named at once.
        try:
            self.compare_at(world, Gathering(base, label, self.timeout, verdict=compare, members=ranks,
                                             working=lambda _, last: at_work(self.cell, last),
                                             on_tick=lambda: self._peer_finished(name, seq, fp, ranks)))
        except BarrierRefused as refused:
            raise CollectiveMismatchError(
                f"{label} does not match across ranks: {refused}. "
                "Nothing was sent; fix the cell so every rank issues the same collectives"
            ) from None

    def _peer_finished(self, name: str, seq: int, fp: dict[str, Any], ranks: list[int] | None) -> None:
        """Fail if a member ended its body (it published its output) without issuing collective ``seq``.

        It reads one count a tick, and a rank's output once, when the count says it ended (:class:`Published`).
        """
        if self.on_tick is not None:
            self.on_tick()
        world = self.world
        who = [i for i in (ranks if ranks is not None else range(world.world_size)) if i != world.rank]
        ended = self._ended.look(world.client, who)
        for i in who:
            done = ended.get(i)
            if done is not None and (issued := (done.collectives or {}).get(name, 0)) < seq:
                if done.error is not None:
                    # It failed: a rank publishes its failure before its output, so this tick's earlier read of
                    # the failure may have come just too soon. Its error is the cause; the missing call follows.
                    raise_if_failed(world, self.cell)
                raise CollectiveMismatchError(
                    f"{world.describe(i)} finished this cell after {issued} collective(s), but "
                    f"{world.describe(world.rank)} issued #{seq} ({fp['op']}): the ranks run different collectives"
                )


def at_work(cell: str, last: records.Note | None) -> bool:
    """Whether a rank's last note says it is still at work in ``cell``'s body: running it (inside a collective
    or not), or waiting in it for a collective's comparison."""
    return last is not None and (last.body == cell or (last.barrier or "").startswith(keys.comparing(cell)))


def group_arg(params: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``group`` argument of a call (None: the default group); ``params``: the function's parameters."""
    if "group" in kwargs:
        return kwargs["group"]
    if "group" in params:
        i = params.index("group")
        if i < len(args):
            return args[i]
    return None


def peer_of(params: list[str], args: tuple[Any, ...], kwargs: dict[str, Any], ranks: list[int] | None) -> int | None:
    """The world rank a send or recv waits for (None: any source); ``ranks``: its group's world ranks."""
    bound = dict(zip(params, args, strict=False))
    bound.update(kwargs)
    for name in ("dst", "src"):
        if bound.get(name) is not None:
            return int(bound[name])
    for name in ("group_dst", "group_src"):
        if bound.get(name) is not None:
            i = int(bound[name])
            return ranks[i] if ranks is not None and 0 <= i < len(ranks) else i
    return None


def skipped_message(op: str, group: list[int] | None, outside: list[int], cell_ranks: tuple[int, ...],
                    world_size: int, p2p: bool = False) -> str:
    """Why a call in a ``--ranks`` cell was refused, and what does what it meant."""
    cell = fold(cell_ranks)
    who = f"{ranks_text(outside)}, which skip{'' if len(set(outside)) > 1 else 's'}"
    if p2p:
        return (f"dist.{op} would wait for {who} this cell (--ranks {cell}), so it could never complete; it was not "
                f"started. Send and receive only between the cell's ranks ({cell})")
    on = ("the default group (every rank)" if group is None or len(group) == world_size
          else f"a group of ranks {fold(group)}")
    return (f"dist.{op} on {on} would wait for {who} this cell (--ranks {cell}), so it could never complete; it was "
            f"not started. Make a group of the cell's ranks once, in a cell every rank runs: "
            f"`sub = dist.new_group([{', '.join(map(str, cell_ranks))}])`; then, in %%collective --ranks {cell}, "
            f"pass it: `dist.{op}(..., group=sub)`")


def raise_if_failed(world: World, cell: str) -> None:
    """on_tick helper: stop waiting when another rank already failed this cell."""
    failure = records.Failure.read(world.client.get_if(world.key(keys.failed(cell))))  # None: none, or not one
    if failure is not None and failure.rank != world.rank:
        raise PeerFailedError(failure.message)
