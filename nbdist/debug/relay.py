"""A debugger's input and output relayed through the store, every part sealed with the world's key.

The debugged rank runs IPython's debugger with :class:`Output` as its stdout and
:class:`Input` as its stdin. When the debugger reads a line, what it wrote up to
its prompt goes to the store as chunk ``j`` (``pdb/<k>/out/<j>``); the asker shows
it, reads a line from its user and writes it as line ``j`` (``pdb/<k>/in/<j>``).
Each is sealed for its direction, request ``k``, world round, the debugged rank
and ``j``: a line sealed for another rank, request or place is refused (and
waited past: the asker's own line overwrites it), so a line read from the store
cannot be replayed. Each chunk and line is deleted once read: the store keeps
no session's text.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..world import keys, records, signing
from ..world.store import StoreClient

log = logging.getLogger(__name__)

OUT, IN = "pdb-out", "pdb-in"  # the purposes chunks and lines are sealed for
IDLE_TIMEOUT = 1800.0  # seconds either side waits for the other (a person reading code) before the debugger quits
POLL = 0.05  # seconds between looks at the store while waiting
LIVENESS_EVERY = 1.0  # seconds between looks at the debugged rank's heartbeat
CHUNK_CHARS = 1_000_000  # a chunk of output is cut to this (the store drops a client over 8 MiB values)


@dataclass(frozen=True)
class Chunk:
    """The debugger's output up to its ``prompt``, or its last output and why it ended (``end``). Its record
    (``pdb/<k>/out/<j>``): these fields with the channel's (:meth:`Channel.publish`), sealed for :data:`OUT`;
    validated where read (:meth:`Channel.poll`)."""

    text: str
    prompt: str = ""
    end: str | None = None

    def record(self) -> dict[str, Any]:
        return {"text": self.text, "prompt": self.prompt, "end": self.end}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Chunk:
        """The chunk a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = records.Fields(value)
        return cls(read.text("text"), read.text("prompt", ""), read.text("end") if value.get("end") is not None
                   else None)


@dataclass(frozen=True)
class Line:
    """A line typed for the debugged rank (None: end of input, which quits its debugger). Its record
    (``pdb/<k>/in/<j>``): ``line`` with the channel's fields (:meth:`Channel.send`), sealed for :data:`IN`;
    validated where read (:meth:`Channel.line`)."""

    line: str | None

    def record(self) -> dict[str, Any]:
        return {"line": self.line}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Line:
        """The line a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = records.Fields(value)
        if "line" not in value:
            raise records.MalformedRecord("it has no 'line'", value)
        return cls(read.text("line") if value["line"] is not None else None)


class Channel:
    """One debugger session's records in the store, for request ``n`` of world round ``round_``, rank ``rank``."""

    def __init__(self, client: StoreClient, key: bytes, round_: int, n: int, rank: int, space: str = "pdb") -> None:
        self.client, self._key, self.round, self.n, self.rank = client, key, round_, n, rank
        self.space = space  # "pdb": a %dist_pdb request's; "bp": a breakpoint's (:mod:`nbdist.debug.breakpoints`)
        self.j = 0  # the next chunk and line
        self.idle_why = ""
        self.refused: set[int] = set()  # lines that did not verify (each logged once)

    def _key_of(self, name: str) -> str:
        return keys.in_round(self.round, name)

    def _fields(self) -> dict[str, Any]:
        fields = {"n": self.n, "round": self.round, "rank": self.rank, "j": self.j}
        return fields if self.space == "pdb" else {**fields, "space": self.space}

    def _verified(self, purpose: str, record: Any) -> bool:
        return signing.sealed(self._key, purpose, record) and all(record.get(k) == v for k, v in self._fields().items())

    def _refuse(self, what: str, why: str) -> None:
        """Record ``j`` is not read: say so once (the right one may still overwrite it)."""
        if self.j not in self.refused:
            self.refused.add(self.j)
            log.warning("nbdist: %s #%d of %s request #%d %s: refused", what, self.j, self.space, self.n, why)

    # --- the debugged rank ---
    def publish(self, text: str, prompt: str = "", end: str | None = None) -> None:
        if len(text) > CHUNK_CHARS:
            half = CHUNK_CHARS // 2
            text = f"{text[:half]}\n… [{len(text) - 2 * half:,} characters cut] …\n{text[-half:]}"
        record = {**self._fields(), **Chunk(text, prompt, end).record()}
        key = self._key_of(keys.pdb_out(self.n, self.j, self.space))
        self.client.set_json(key, signing.seal(self._key, OUT, record))

    def close_with(self, why: str, text: str = "") -> None:
        """The last chunk: the debugger ended (or never opened), and why."""
        self.publish(text, end=why)

    def line(self) -> tuple[bool, str | None]:
        """Line ``j``, if it is in the store and verifies: (True, the line, None for end of input); else
        (False, None). A refused one is logged once."""
        record = records.object_or_none(self.client.get_if(self._key_of(keys.pdb_in(self.n, self.j, self.space))))
        if record is None:
            return False, None
        if not self._verified(IN, record):
            self._refuse("debugger input line", "did not verify (not signed for this rank, request and place)")
            return False, None
        try:
            line = Line.from_dict(record)
        except records.MalformedRecord as exc:
            self._refuse("debugger input line", f"is not one nbdist writes ({exc})")
            return False, None
        # read once: the store keeps no session's text
        self.client.delete(self._key_of(keys.pdb_in(self.n, self.j, self.space)))
        return True, line.line

    def wait_line(self, idle: float, gone: Callable[[], str | None] = lambda: None) -> str | None:
        """The next line typed for this rank (None: end of input, nobody typed for ``idle`` s, or the asker is
        ``gone()``)."""
        deadline = time.monotonic() + idle
        next_look = time.monotonic() + LIVENESS_EVERY
        while True:
            found, line = self.line()
            if found:
                self.j += 1
                return line
            now = time.monotonic()
            if now >= next_look:
                next_look = now + LIVENESS_EVERY
                why = gone()
                if why is not None:
                    self._give_up(f"{why}: the debugger quit")
                    return None
            if now >= deadline:
                self._give_up(f"no line came for {idle:g} s: the debugger quit")
                return None
            time.sleep(POLL)

    def _give_up(self, why: str) -> None:
        """No line ``j`` will be read: the last chunk goes after it, where an asker that still types looks."""
        self.idle_why = why
        self.j += 1

    # --- the asker ---
    def send(self, line: str | None) -> None:
        """Line ``j`` for the debugged rank (None: end of input, which quits its debugger)."""
        record = signing.seal(self._key, IN, {**self._fields(), **Line(line).record()})
        self.client.set_json(self._key_of(keys.pdb_in(self.n, self.j, self.space)), record)
        self.j += 1

    def receive(self, timeout: float, gone: Callable[[], str | None]) -> Chunk:
        """Chunk ``j`` once it verifies; an ending chunk if the debugged rank is ``gone()`` or silent ``timeout`` s."""
        deadline = time.monotonic() + timeout
        next_look = time.monotonic() + LIVENESS_EVERY
        while True:
            chunk = self.poll()
            if chunk is not None:
                return chunk
            now = time.monotonic()
            if now >= next_look:
                next_look = now + LIVENESS_EVERY
                why = gone()
                if why is not None:
                    return Chunk("", end=f"{why}; its debugger ended with it")
            if now >= deadline:
                return Chunk("", end=f"no answer from rank {self.rank} within {timeout:g} s (its Python may be busy "
                                     "in one long call: %dist_status says whether it lives)")
            time.sleep(POLL)


    def poll(self) -> Chunk | None:
        """Chunk ``j`` if it is in the store and verifies (then deleted: read once); None if not (yet)."""
        key = self._key_of(keys.pdb_out(self.n, self.j, self.space))
        record = records.object_or_none(self.client.get_if(key))
        if record is None:
            return None
        if not self._verified(OUT, record):
            self._refuse("debugger output", "did not verify")
            return None
        try:
            chunk = Chunk.from_dict(record)
        except records.MalformedRecord as exc:
            self._refuse("debugger output", f"is not one nbdist writes ({exc})")
            return None
        self.client.delete(key)
        return chunk


class Output(io.TextIOBase):
    """The debugger's stdout: kept until it reads a line, then sent with its prompt."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def take(self) -> str:
        text = "".join(self._parts)
        self._parts.clear()
        return text


class Input:
    """The debugger's stdin: each ``readline`` sends what it wrote and waits for the next line typed."""

    def __init__(self, channel: Channel, out: Output, idle: float, gone: Callable[[], str | None]) -> None:
        self.channel, self.out, self.idle, self.gone = channel, out, idle, gone
        self.prompt = ""

    def readline(self) -> str:
        text = self.out.take()
        if self.prompt and text.endswith(self.prompt):
            text = text[: -len(self.prompt)]
        self.channel.publish(text, self.prompt or "ipdb> ")
        line = self.channel.wait_line(self.idle, self.gone)
        return "" if line is None else line + "\n"  # "": end of input, which quits the debugger


def debug(channel: Channel, tb: TracebackType, idle: float = IDLE_TIMEOUT,
          gone: Callable[[], str | None] = lambda: None) -> None:
    """IPython's debugger, post-mortem on ``tb``, its input and output relayed through ``channel`` until it ends
    (end of input, ``q`` or ``c``; ``idle`` s with no line; the asker ``gone()``)."""
    from IPython.core.debugger import Pdb

    out = Output()
    stdin = Input(channel, out, idle, gone)
    debugger = Pdb(stdin=stdin, stdout=out, nosigint=True)  # no SIGINT handler: this is not the main thread
    stdin.prompt = debugger.prompt
    debugger.reset()
    debugger.interaction(None, tb)
    channel.close_with(channel.idle_why or "the debugger ended", out.take())
