"""``%dist_where``'s protocol: a signed request through the store, each rank's signed answer from a background thread.

Nothing listens on a new port. The asker (a notebook, or ``nbdist where`` in a
terminal) raises the world round's request counter and writes the request,
sealed with the world's key (:func:`nbdist.world.signing.seal`). Each rank
looks at the counter once per heartbeat, from its heartbeat thread (one
``add(key, 0)``: the whole idle cost), so it answers while its cell runs; on
a request that verifies it samples itself in a short-lived thread (its
stacks, its Flight Recorder, py-spy on request) and writes its answer, sealed
too, then counts it in. The asker reads the answers once all ranks counted
in, or at its timeout, and names the ranks that did not answer. A request
names its own number and round inside what is signed, so an old one written
again under a new number does not verify.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreConnectionError
from ..world import keys, records, signing
from ..world.store import StoreClient
from . import native, recorder, report, stacks

log = logging.getLogger(__name__)

ASK, ANSWER = "where-ask", "where-answer"  # the purposes records are sealed for
DEFAULT_TIMEOUT = 10.0  # seconds the asker waits for every rank's answer
ANSWER_BYTES = 4 * 1024 * 1024  # an answer is cut to fit this (the store drops a client over 8 MiB values)
CUT_FRAMES = 60  # innermost frames per thread kept when an answer must be cut


class Keys:
    """Every store key of the protocol, for one world round."""

    def __init__(self, round_: int) -> None:
        self.round = round_

    @property
    def asks(self) -> str:
        return keys.in_round(self.round, keys.WHERE_ASKS)

    def ask(self, n: int) -> str:
        return keys.in_round(self.round, keys.where_ask(n))

    def answer(self, n: int, rank: int) -> str:
        return keys.in_round(self.round, keys.where_answer(n, rank))

    def answered(self, n: int) -> str:
        return keys.in_round(self.round, keys.where_answered(n))


@dataclass(frozen=True)
class Request:
    """What the asker wants: the other threads too, native frames (py-spy). Its record (``where/ask/<n>``): these
    fields, sealed for :data:`ASK`; validated where read (:meth:`read`)."""

    n: int
    round: int
    threads: bool = False
    native: bool = False
    by: str = ""
    t: float = 0.0

    def record(self) -> dict[str, Any]:
        return {"n": self.n, "round": self.round, "threads": self.threads, "native": self.native, "by": self.by,
                "t": self.t}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Request:
        """The request a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = records.Fields(value)
        return cls(read.count("n"), read.count("round"), read.flag("threads"), read.flag("native"),
                   read.text("by", ""), read.number("t", 0.0))

    @classmethod
    def read(cls, record: Any, key: bytes, n: int, round_: int) -> Request | None:
        """The request in ``record``, if it is sealed with ``key`` for number ``n`` of round ``round_`` and is one
        (None: not a JSON object, not sealed, or not a request)."""
        return signing.opened(cls.from_dict, record, key, ASK, n, round_)


@dataclass
class Answer:
    """One rank's answer: its threads' stacks, its Flight Recorder, and py-spy's native frames or why not. Its record
    (``where/answer/<n>/<rank>``): these fields, with ``n`` and ``round``, sealed for :data:`ANSWER` (unsealed when
    the rank ``refused``); validated where read (:meth:`from_dict`)."""

    rank: int
    host: str = ""
    pid: int = 0
    threads: list[dict[str, Any]] = field(default_factory=list)
    recorder: dict[str, Any] = field(default_factory=dict)
    native: str | None = None  # why native frames are missing, when they were asked for
    refused: str | None = None  # why the rank could not answer (no key to check the request with)

    def record(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "pid": self.pid, "threads": self.threads,
                "recorder": self.recorder, "native": self.native, "refused": self.refused}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Answer:
        """The answer a JSON object holds, or raise :class:`.records.MalformedRecord` naming why it is not one."""
        read = records.Fields(value)
        return cls(read.count("rank"), read.text("host", ""), read.count("pid") if "pid" in value else 0,
                   read.objects("threads") if value.get("threads") is not None else [],
                   read.object("recorder") if value.get("recorder") is not None else {},
                   read.text("native") if value.get("native") is not None else None,
                   read.text("refused") if value.get("refused") is not None else None)


def sample(rank: int, request: Request) -> Answer:
    """This process, now: what a rank answers (called from a thread that is not the cell's)."""
    answer = Answer(rank, socket.gethostname(), os.getpid())
    if request.native:
        got = native.dump(request.threads)
        if "threads" in got:
            answer.threads = got["threads"]
        else:
            answer.native = got["error"]
    if not answer.threads:
        answer.threads = stacks.capture(request.threads, skip=[threading.get_ident()])
    try:
        answer.recorder = recorder.capture()
    except Exception as exc:  # torch's internal dump: say what went wrong instead of no answer
        answer.recorder = {"off": f"the Flight Recorder could not be read ({type(exc).__name__}: {exc})"}
    return fit(answer)


def fit(answer: Answer, limit: int = ANSWER_BYTES) -> Answer:
    """``answer``, cut to ``limit`` bytes of JSON if it is larger: each thread's innermost frames, then the
    main thread alone, then the Flight Recorder's latest entries."""
    if len(json.dumps(answer.record())) <= limit:
        return answer
    for thread in answer.threads:
        cut = len(thread["frames"]) - CUT_FRAMES
        if cut > 0:
            thread["frames"], thread["skipped"] = thread["frames"][cut:], thread.get("skipped", 0) + cut
    if len(json.dumps(answer.record())) > limit:
        answer.threads = [t for t in answer.threads if t.get("main")]
    while len(json.dumps(answer.record())) > limit and answer.recorder.get("entries"):
        answer.recorder["entries"] = answer.recorder["entries"][len(answer.recorder["entries"]) // 2 + 1:]
    return answer


class Responder:
    """A rank's side: :meth:`tick` runs once per heartbeat, in the heartbeat thread, with its store client."""

    def __init__(self, round_: int, rank: int, key: bytes | None, refusal: str = "", seen: int = 0) -> None:
        self.keys, self.rank, self._key, self._refusal = Keys(round_), rank, key, refusal
        self.seen = seen  # requests up to this number were answered, or were made before this rank joined
        self._busy = threading.Lock()

    def tick(self, client: StoreClient) -> None:
        """Look for a new request (one store op); answer it from a short-lived thread."""
        n = client.add(self.keys.asks, 0)
        if n <= self.seen or self._busy.locked():
            return
        text = client.get_if(self.keys.ask(n))
        if text is None:
            return  # counted, not yet written: the next beat looks again
        self.seen = n
        record = records.object_or_none(text)  # anyone's text: one that is not a request does not verify
        if self._key is None:
            request: Request | None = Request(n, self.keys.round)
        else:
            request = Request.read(record, self._key, n, self.keys.round)
            if request is None:
                log.warning("nbdist: a %%dist_where request (#%d) did not verify: not answered", n)
                return
        own = client.clone(op_timeout=5.0)  # before taking the lock: a failed connect must not keep it
        self._busy.acquire()
        threading.Thread(target=self._answer, args=(own, request), name="nbdist-where", daemon=True).start()

    def _answer(self, client: StoreClient, request: Request) -> None:
        try:
            if self._key is None:
                answer = Answer(self.rank, socket.gethostname(), os.getpid(), refused=self._refusal)
                record = answer.record()
            else:
                record = signing.seal(self._key, ANSWER, {**sample(self.rank, request).record(), "n": request.n,
                                                          "round": request.round})
            client.set_json(self.keys.answer(request.n, self.rank), record)
            client.add(self.keys.answered(request.n), 1)
        except StoreConnectionError as exc:
            log.info("nbdist: could not answer %%dist_where: %s", exc)
        except Exception:  # never let an answer's bug pass silently: the asker names this rank as not answering
            log.exception("nbdist: answering %%dist_where")
        finally:
            client.close()
            self._busy.release()


@dataclass
class Gathered:
    """What the asker got: answers by rank, and the ranks that did not answer (or whose answer did not verify)."""

    answers: dict[int, Answer]
    silent: dict[int, str]
    seconds: float


def ask(client: StoreClient, round_: int, world_size: int, key: bytes, *, threads: bool = False,
        native: bool = False, timeout: float = DEFAULT_TIMEOUT, by: str = "",
        on_tick: Callable[[], None] | None = None) -> Gathered:
    """Ask every rank of world round ``round_`` where it is; wait up to ``timeout`` s for the answers."""
    keys = Keys(round_)
    started = time.monotonic()
    n = client.add(keys.asks, 1)
    request = Request(n, round_, threads, native, by, time.time())
    client.set_json(keys.ask(n), signing.seal(key, ASK, request.record()))
    deadline = started + timeout
    while client.add(keys.answered(n), 0) < world_size and time.monotonic() < deadline:
        if on_tick is not None:
            on_tick()
        time.sleep(0.05)
    answers: dict[int, Answer] = {}
    silent: dict[int, str] = {}
    for rank in range(world_size):
        record = records.object_or_none(client.get_if(keys.answer(n, rank)))  # anyone's text: none if not one
        if record is None:
            silent[rank] = f"no answer within {timeout:g} s"
        elif record.get("refused") and isinstance(record["refused"], str):
            silent[rank] = f"it cannot check requests: {record['refused']}"
        elif (not signing.sealed(key, ANSWER, record) or record.get("n") != n or record.get("round") != round_
              or record.get("rank") != rank):
            silent[rank] = "its answer did not verify (not signed with this world's key)"
        else:
            try:
                answers[rank] = Answer.from_dict(record)
            except records.MalformedRecord as exc:
                silent[rank] = f"its answer is not one nbdist writes ({exc})"
    return Gathered(answers, silent, time.monotonic() - started)


def where(client: StoreClient, round_: int, world_size: int, key: bytes, describe: Callable[[int], str], *,
          threads: bool = False, native: bool = False, timeout: float = DEFAULT_TIMEOUT, by: str = "") -> str:
    """Ask every rank (:func:`ask`) and return the report (:func:`nbdist.debug.report.text`)."""
    got = ask(client, round_, world_size, key, threads=threads, native=native, timeout=timeout, by=by)
    return report.text(got.answers, got.silent, world_size, describe, native=native, threads=threads,
                       seconds=got.seconds)


def responder(client: StoreClient, round_: int, rank: int, secret: Callable[[], str]) -> Responder:
    """A rank's responder for world round ``round_``: requests made before it joined are not for it."""
    try:
        key, refusal = signing.key_from(secret()), ""
    except signing.SigningError as exc:
        key, refusal = None, str(exc)
    return Responder(round_, rank, key, refusal, seen=client.add(Keys(round_).asks, 0))
