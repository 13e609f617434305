"""Breakpoints in a ``%%collective`` body on any rank: ``breakpoint()``, ``pdb.set_trace()``, :func:`breakpoint`.

While a body runs, nbdist stands in for ``sys.breakpointhook`` and ``pdb.set_trace``
(:meth:`Breakpoints.armed`), so that the rank that calls one stops in IPython's debugger:

- **a rank with a notebook of its own** (a peer, or the driving notebook's own rank): the debugger opens in
  that notebook, as ``%debug`` does, below the cell's live table;
- **a driven rank** (``--spawn``, ``--slurm``, ``nbdist follow``), which has no front end: the debugger runs
  there with its input and output relayed through the store (:mod:`nbdist.debug.relay`, under ``bp/``).
  The rank raises the round's breakpoint counter and writes a record sealed with the world's key (its
  rank and cell line); the driving notebook, wherever it waits in nbdist during the cell (a collective,
  a comparison, the cell's end), looks for such records (:meth:`Breakpoints.serve`, one store operation
  every 0.2 s), shows that rank's output and reads each line with ``input()``, labelled
  ``rank 3 (host) ipdb>``. Ranks stopped at once are answered one after another, each prompt labelled.

While a rank is at a prompt its note keeps saying that it runs the body, so every other rank's wait holds
(``--timeout`` counts only for ranks not at work), and its live place reads ``in the debugger at cell line
5``. A cell whose source calls a breakpoint runs with the process groups' timeouts raised to an hour on
every rank, as ``torch.distributed.breakpoint`` raises them. ``q`` (or the end of input) ends the body with
``bdb.BdbQuit``, which ends the cell on every rank as the stop button does; so does the stop button at
the prompt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pdb
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

from .. import ranksets
from ..view.tracebacks import is_cell
from ..world import keys, records, signing
from ..world.liveness import PeerTracker
from ..world.world import World
from . import relay

log = logging.getLogger(__name__)

ASK = "bp-ask"  # the purpose a breakpoint's record is sealed for
LOOK_EVERY = 0.2  # seconds between the driving notebook's looks for a stopped rank while it waits in nbdist
HELD_TIMEOUT = 3600.0  # seconds: the process groups' timeout in a cell that calls a breakpoint (torch's own choice)
_CALLS = re.compile(r"\b(breakpoint|set_trace)\s*\(")


@dataclass(frozen=True)
class Stopped:
    """Rank ``rank`` stopped at a breakpoint of ``cell`` (at cell line ``line``, if known): the ``n``-th of world
    round ``round``. Its record (``bp/ask/<n>``): these fields, sealed for :data:`ASK`; validated where read
    (:meth:`read`)."""

    n: int
    round: int
    rank: int
    cell: str
    line: int | None = None
    t: float = 0.0

    def record(self) -> dict[str, Any]:
        return {"n": self.n, "round": self.round, "rank": self.rank, "cell": self.cell, "line": self.line,
                "t": self.t}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Stopped:
        """The breakpoint a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = records.Fields(value)
        return cls(read.count("n"), read.count("round"), read.count("rank"), read.text("cell"),
                   read.count("line") if value.get("line") is not None else None, read.number("t", 0.0))

    @classmethod
    def read(cls, record: Any, key: bytes, n: int, round_: int) -> Stopped | None:
        """The breakpoint in ``record``, if it is sealed with ``key`` for number ``n`` of round ``round_`` and is
        one (None: not a JSON object, not sealed, or not a breakpoint's record)."""
        return signing.opened(cls.from_dict, record, key, ASK, n, round_)


def calls_breakpoint(source: str) -> bool:
    """Whether a cell's source calls ``breakpoint()``, ``pdb.set_trace()`` or ``nbdist.breakpoint()``."""
    return _CALLS.search(source) is not None


def cell_line_of(frame: FrameType | None) -> int | None:
    """The notebook cell's line that ``frame`` (or the innermost cell frame around it) is at."""
    while frame is not None:
        if is_cell(frame.f_code.co_filename):
            return frame.f_lineno
        frame = frame.f_back
    return None


def real_stream(stream: Any) -> Any:
    """The kernel's own stream behind nbdist's routing (:class:`nbdist.cell.capture.RoutedStream`)."""
    return getattr(stream, "real", stream)


class _Flushed:
    """A stream that flushes after each write: the debugger's text reaches the notebook before its prompt."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        n = self.stream.write(text)
        self.stream.flush()
        return int(n or 0)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _debugger(here: Here, **kwargs: Any) -> Any:
    """IPython's debugger (the stop button quits it), telling ``here`` when it waits at a prompt."""
    from IPython.core.debugger import InterruptiblePdb

    class CellPdb(InterruptiblePdb):
        first: FrameType | None = None  # where set_trace stops first

        def set_trace(self, frame: FrameType | None = None, **kwargs: Any) -> None:
            self.first = frame = frame or sys._getframe(1)  # noqa: SLF001 (the caller's, as pdb.set_trace takes it)
            super().set_trace(frame, **kwargs)  # type: ignore[no-untyped-call]  # IPython's, untyped

        def set_step(self) -> None:
            """set_trace's first stop is the next line of the frame it was given (the body, where breakpoint()
            was called), not the first call that comes before it: a garbage collection's weakref callback, say,
            where ``q`` would be swallowed as the callback's error and the body would run on."""
            first, self.first = self.first, None
            if first is None:
                super().set_step()
            else:
                self._set_stopinfo(first, None)  # type: ignore[attr-defined]  # bdb's, not in typeshed

        def interaction(self, frame: FrameType | None, tb_or_exc: Any) -> None:
            here.entered(frame)
            try:
                super().interaction(frame, tb_or_exc)  # type: ignore[no-untyped-call]  # IPython's, untyped
            except Exception as exc:  # noqa: BLE001 (no input here: the body goes on, saying why)
                if type(exc).__name__ != "StdinNotImplementedError":
                    raise
                self.set_continue()
                sys.settrace(None)
                here.cannot_ask()
            finally:
                here.left()
            here.after(self)

    return CellPdb(**kwargs)


class Here:
    """One ``%%collective`` body on this rank, while breakpoints stop in nbdist's debugger."""

    def __init__(self, world: World, cell: str, label: str, driven: bool, key: Callable[[], bytes | None], out: Any,
                 driver: int | None = None) -> None:
        self.world, self.cell, self.label, self.driven, self.out = world, cell, label, driven, out
        self.key = key  # the world's key, taken when a breakpoint is relayed (a key costs a millisecond)
        self.driver = driver
        self.at: int | None = None  # the cell line of the prompt this rank waits at (None: not at a prompt)
        self.channel: relay.Channel | None = None  # a driven rank's relay, while its debugger runs
        self.output: relay.Output | None = None
        self._ended = False

    def place(self) -> str | None:
        """Where this rank is, for the live table, while it waits at a prompt."""
        return None if self.at is None else f"in the debugger at cell line {self.at}"

    def stop(self, frame: FrameType) -> None:
        """Open the debugger at ``frame``: here, or relayed to the driving notebook (a driven rank)."""
        if self.driven:
            self._relayed(frame)
            return
        debugger = _debugger(self, stdout=_Flushed(self.out))
        debugger.use_rawinput = True  # read with input(): the notebook's input box (pdb reads stdin when given stdout)
        debugger.set_trace(frame)

    def _relayed(self, frame: FrameType) -> None:
        key = self.key()
        if key is None:
            self.out.write(f"nbdist: {self.world.describe(self.world.rank)} cannot relay its debugger (the world "
                           "has no key to sign it with): the breakpoint is skipped\n")
            return
        world, client = self.world, self.world.client
        n = client.add(world.key(keys.BP_ASKS), 1)
        stopped = Stopped(n, world.round, world.rank, self.cell, cell_line_of(frame), time.time())
        client.set_json(world.key(keys.bp_ask(n)), signing.seal(key, ASK, stopped.record()))
        self.channel = relay.Channel(client, key, world.round, n, world.rank, space="bp")
        self.output = relay.Output()
        stdin = relay.Input(self.channel, self.output, relay.IDLE_TIMEOUT, self._gone())
        debugger = _debugger(self, stdin=stdin, stdout=self.output, nosigint=True)
        stdin.prompt = debugger.prompt
        self._ended = False
        debugger.set_trace(frame)

    def _gone(self) -> Callable[[], str | None]:
        """Why a relayed debugger must quit while it waits for a line: the cell was ended by another rank, or
        the driving notebook's kernel is gone."""
        world = self.world
        tracker = PeerTracker(world.ranks, world.rank)

        def why() -> str | None:
            failed = records.Failure.read(world.client.get_if(world.key(keys.failed(self.cell))))
            if failed is not None and failed.rank != world.rank:
                return f"the cell ended ({failed.message})"
            dead = [] if self.driver is None else tracker.dead(world.client, [self.driver])
            return next((f"the driving notebook, {world.describe(i)}, {why}" for i, why in dead), None)

        return why

    def entered(self, frame: FrameType | None) -> None:
        self.at = cell_line_of(frame) or 0
        with contextlib.suppress(Exception):  # a note is for the others' waits and %dist_status only
            self.world.notes.write(f"in the debugger at cell line {self.at}", body=self.cell)

    def left(self) -> None:
        self.at = None
        with contextlib.suppress(Exception):
            self.world.notes.write(f"running {self.label}", body=self.cell)

    def cannot_ask(self) -> None:
        self.out.write("nbdist: this notebook's front end takes no input here: the breakpoint is skipped\n")

    def after(self, debugger: Any) -> None:
        """A relayed debugger that quit or let the body run on says so: the driving notebook stops waiting
        for its next prompt."""
        if self.channel is None or self.output is None or self._ended:
            return
        who = self.world.describe(self.world.rank)
        if debugger.quitting:
            self._ended = True
            self.channel.close_with(self.channel.idle_why or f"{who} quit its debugger: the cell ends on every rank",
                                    self.output.take())
        elif sys.gettrace() is None:
            self._ended = True
            self.channel.close_with(f"{who} goes on", self.output.take())


class Breakpoints:
    """This kernel's breakpoints, for its lifetime: armed during each ``%%collective`` body; a driving notebook
    answers its followers' while its cell runs (:meth:`answering`)."""

    def __init__(self, secret: Callable[[], str], pg_timeout: Callable[[], float], out: Any = None,
                 read_line: Callable[[str], str] | None = None) -> None:
        self.secret, self.pg_timeout = secret, pg_timeout
        self.out = out  # where this notebook's debugger and relayed prompts write (None: the kernel's stdout)
        self.read_line = read_line  # reads a line typed for a relayed prompt (None: input(), the notebook's box)
        self.here: Here | None = None
        self._answering: tuple[World, str] | None = None  # (world, cell) while this notebook answers
        self._keys: tuple[int, int, bytes | None] | None = None  # (id of the world, its round, its key)
        self._seen: tuple[int, int] = (-1, 0)  # (world round, the last breakpoint record looked at)
        self._open: dict[int, tuple[relay.Channel, str]] = {}
        self._next_look = 0.0
        self._busy = False
        self._last = 0  # the breakpoint whose prompt was answered last

    def place(self) -> str | None:
        here = self.here
        return None if here is None else here.place()

    def key_for(self, world: World) -> bytes | None:
        """The world's key (None: it has none here), made once per world round: it costs a millisecond."""
        cached = self._keys
        if cached is not None and cached[:2] == (id(world), world.round):
            return cached[2]
        try:
            key: bytes | None = signing.key_from(self.secret())
        except signing.SigningError:
            key = None
        self._keys = (id(world), world.round, key)
        return key

    def _out(self) -> Any:
        return self.out if self.out is not None else real_stream(sys.stdout)

    @contextlib.contextmanager
    def armed(self, world: World, cell: str, label: str, source: str, driver: int | None) -> Iterator[None]:
        """During a body: ``breakpoint()``, ``pdb.set_trace()`` and :func:`breakpoint` stop in nbdist's debugger."""
        driven = driver is not None and driver != world.rank
        here = Here(world, cell, label, driven, lambda: self.key_for(world), self._out(), driver)
        saved = sys.breakpointhook, pdb.set_trace
        sys.breakpointhook, pdb.set_trace = self._hook, self._set_trace
        restore = _hold_timeouts(self.pg_timeout()) if calls_breakpoint(source) else None
        self.here = here
        try:
            yield
        finally:
            self.here = None
            sys.breakpointhook, pdb.set_trace = saved
            if restore is not None:
                restore()

    def _hook(self, *args: Any, **kwargs: Any) -> None:
        """``sys.breakpointhook`` during a body: ``breakpoint()``."""
        self.stop_at(sys._getframe(1))  # noqa: SLF001 (the caller's frame, as pdb.set_trace takes it)

    def _set_trace(self, *args: Any, header: str | None = None, **kwargs: Any) -> None:
        """``pdb.set_trace`` during a body."""
        if header is not None:
            self._out().write(header + "\n")
        self.stop_at(sys._getframe(1))  # noqa: SLF001

    def stop_at(self, frame: FrameType) -> None:
        here = self.here
        if os.environ.get("PYTHONBREAKPOINT") == "0":
            return  # breakpoints switched off, as Python's own hook honours it
        if here is None or threading.current_thread() is not threading.main_thread():
            pdb.Pdb().set_trace(frame)  # outside a body, or in a thread of it: Python's own
            return
        here.stop(frame)

    # --- the driving notebook's side ---------------------------------------------------------
    @contextlib.contextmanager
    def answering(self, world: World, cell: str) -> Iterator[None]:
        """While this notebook's driven ``cell`` runs (its body and its end): wherever it waits in nbdist, it
        answers its followers' breakpoints (:meth:`serve`)."""
        self._answering, self._open, self._next_look = (world, cell), {}, 0.0
        world.attend = self.serve
        try:
            yield
        finally:
            world.attend = None
            self._answering = None
            with contextlib.suppress(Exception):  # a debugger that said it goes on as the cell ended: show it
                self._answer(self._out(), prompt=False)
            self._open = {}

    def serve(self) -> None:
        """While this notebook waits in nbdist (main thread): show a driven rank's debugger and send its line."""
        if self._busy or self._answering is None or threading.current_thread() is not threading.main_thread():
            return
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY
        world, cell = self._answering
        key = self.key_for(world)
        if key is None:
            return  # nothing can be checked here: a driven rank's breakpoint says it cannot relay
        self._busy = True
        try:
            out = self._out()
            self._look(out, world, key, cell)
            self._answer(out)
        finally:
            self._busy = False

    def _look(self, out: Any, world: World, key: bytes, cell: str) -> None:
        seen_round, seen = self._seen
        if seen_round != world.round:
            seen = 0
        last = world.client.add(world.key(keys.BP_ASKS), 0)
        while seen < last:
            seen += 1
            record = records.object_or_none(world.client.get_if(world.key(keys.bp_ask(seen))))
            if record is None:
                seen -= 1  # counted, not yet written: the next look reads it
                break
            stopped = Stopped.read(record, key, seen, world.round)
            if stopped is None:
                log.warning("nbdist: a breakpoint record (#%d) did not verify: not answered", seen)
                continue
            if stopped.cell != cell:
                continue  # a breakpoint of an earlier cell
            label = relay_label(world, stopped.rank)
            at = stopped.line
            out.write(f"nbdist: {label} stopped at a breakpoint{f' at cell line {at}' if at else ''}\n")
            self._open[seen] = (relay.Channel(world.client, key, world.round, seen, stopped.rank, space="bp"), label)
        self._seen = (world.round, seen)

    def _answer(self, out: Any, prompt: bool = True) -> None:
        """Show what the stopped ranks wrote; read one line, for the rank answered last if it waits again (a
        person steps one rank on), else for the first that waits."""
        order = sorted(self._open, key=lambda n: (n != self._last, n))
        for n in order:
            channel, label = self._open[n]
            chunk = channel.poll()
            if chunk is None:
                continue
            if chunk.text:
                out.write(chunk.text if chunk.text.endswith("\n") else chunk.text + "\n")
            if chunk.end is not None:
                out.write(f"nbdist: {chunk.end}\n")
                del self._open[n]
                continue
            if not prompt:
                continue
            out.flush()
            text = f"{label} {chunk.prompt.strip()} "
            try:
                line: str | None = input(text) if self.read_line is None else self.read_line(text)
            except EOFError:
                line = None
            except KeyboardInterrupt:  # the stop button: that rank's debugger quits, this cell stops
                channel.send(None)
                del self._open[n]
                raise
            except Exception as exc:  # noqa: BLE001 (only a front end that takes no input: nbclient, nbdist run)
                if type(exc).__name__ != "StdinNotImplementedError":
                    raise
                out.write(f"nbdist: this notebook's front end takes no input: {label}'s breakpoint is skipped\n")
                line = "c"  # as a peer's own breakpoint is skipped where it cannot ask
            channel.send(line)
            self._last = n
            return  # one line per look: the rank answered may stop again at once


def relay_label(world: World, rank: int) -> str:
    """A relayed prompt's label: ``rank 3 (host)``."""
    info = world.ranks[rank] if rank < len(world.ranks) else None
    return f"rank {rank} ({'?' if info is None else info.host})"


def _hold_timeouts(seconds: float) -> Callable[[], None]:
    """Raise every process group's timeout to :data:`HELD_TIMEOUT` for collectives started from now (as
    ``torch.distributed.breakpoint`` does); the returned function puts ``seconds`` back."""
    groups = _groups()
    for group in groups:
        _set_timeout(group, max(seconds, HELD_TIMEOUT))

    def restore() -> None:
        for group in groups:
            _set_timeout(group, seconds)

    return restore


def _groups() -> list[Any]:
    try:
        from torch.distributed import distributed_c10d as c10d

        return list(c10d._world.pg_map)  # noqa: SLF001 (torch.distributed.breakpoint reads the same map)
    except Exception:  # noqa: BLE001 (no torch, or no group: nothing to hold)
        return []


def _set_timeout(group: Any, seconds: float) -> None:
    import warnings

    from torch.distributed import distributed_c10d as c10d

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a backend without the setting (HCCL's) keeps its own
            c10d._set_pg_timeout(timedelta(seconds=seconds), group)  # noqa: SLF001
    except Exception as exc:  # noqa: BLE001 (a group torch no longer knows)
        log.debug("nbdist: could not set a group's timeout: %s", exc)


def breakpoint(ranks: str | int | list[int] | None = None, frame: FrameType | None = None) -> None:  # noqa: A001
    """Stop in the debugger on ``ranks`` only (``"1,3"``, ``"0-2"``, ``2``, a list; None: every rank).

    Inside a ``%%collective`` body, as ``breakpoint()`` there (:mod:`nbdist.debug.breakpoints`). Elsewhere
    (a plain cell, a script exported with ``nbdist export``), Python's debugger on the listed ranks, as
    ``breakpoint()`` in a torchrun script: the rank is torch's, or the ``RANK`` environment variable.
    """
    rank = _this_rank()
    if ranks is not None and rank not in _ranks(ranks):
        return
    frame = frame or sys._getframe(1)  # noqa: SLF001 (the caller's frame)
    hook = sys.breakpointhook
    owner = getattr(hook, "__self__", None)
    if isinstance(owner, Breakpoints):
        owner.stop_at(frame)
    elif os.environ.get("PYTHONBREAKPOINT") != "0":
        pdb.Pdb().set_trace(frame)


def _ranks(ranks: str | int | list[int]) -> list[int]:
    if isinstance(ranks, int):
        return [ranks]
    if isinstance(ranks, str):
        return ranksets.parse(ranks)
    return [int(r) for r in ranks]


def _this_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001 (no torch: the environment's rank)
        pass
    return int(os.environ.get("RANK", "0"))


__all__ = ["Breakpoints", "Stopped", "breakpoint", "calls_breakpoint"]
