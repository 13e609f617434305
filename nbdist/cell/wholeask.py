"""A rank's whole output of a cell, for a notebook on another host: a signed request through the store, and the
rank's signed answer from its heartbeat thread (the pattern of :mod:`nbdist.debug.where`).

``nbdist.rank_output(k, full=True)`` reads rank k's kept file (:mod:`nbdist.cell.wholeoutput`) where it is on
this notebook's disk; elsewhere it asks: it raises the round's count of requests and writes the request (rank,
the file the record named), sealed with the world's key. Rank k looks at the count once per heartbeat (one
``add(key, 0)``); on a request for itself that verifies, it reads the file, which must be one of its own kept
files, from a short-lived thread, and writes it in parts of :data:`PART_CHARS` characters, then the answer,
sealed, with the parts' count and digest. The asker reads the parts, checks the digest and deletes the keys.
Nothing listens on a new port; the store holds a file only while it is being fetched.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StoreConnectionError
from ..world import keys, records, signing
from ..world.store import StoreClient

log = logging.getLogger(__name__)

ASK, ANSWER = "whole-ask", "whole-answer"  # the purposes records are sealed for
PART_CHARS = 1024 * 1024  # characters per store value: at most 4 MiB of UTF-8, under the store's 8 MiB
TIMEOUT = 30.0  # seconds the asker waits for the answer


@dataclass(frozen=True)
class Request:
    """Rank ``rank``'s file ``path``, asked as number ``n`` of round ``round`` (sealed for :data:`ASK`)."""

    n: int
    round: int
    rank: int
    path: str

    def record(self) -> dict[str, Any]:
        return {"n": self.n, "round": self.round, "rank": self.rank, "path": self.path}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Request:
        read = records.Fields(value)
        return cls(read.count("n"), read.count("round"), read.count("rank"), read.text("path"))


class Responder:
    """A rank's side: :meth:`tick` runs once per heartbeat, in the heartbeat thread, with its store client."""

    def __init__(self, round_: int, rank: int, key: bytes | None, folder: Path, seen: int = 0) -> None:
        self.round, self.rank, self._key, self.folder = round_, rank, key, folder
        self.seen = seen  # requests up to this number were looked at, or made before this rank joined
        self._busy = threading.Lock()

    def tick(self, client: StoreClient) -> None:
        n = client.add(keys.in_round(self.round, keys.WHOLE_ASKS), 0)
        if n <= self.seen or self._busy.locked():
            return
        text = client.get_if(keys.in_round(self.round, keys.whole_ask(n)))
        if text is None:
            return  # counted, not yet written: the next beat looks again
        self.seen = n
        if self._key is None:
            return  # no key to check it with: the asker times out, naming this rank
        request = signing.opened(Request.from_dict, records.object_or_none(text), self._key, ASK, n, self.round)
        if request is None or request.rank != self.rank:
            return  # another rank's, or not one that verifies
        own = client.clone(op_timeout=10.0)  # before taking the lock: a failed connect must not keep it
        self._busy.acquire()
        threading.Thread(target=self._answer, args=(own, request), name="nbdist-whole", daemon=True).start()

    def _answer(self, client: StoreClient, request: Request) -> None:
        assert self._key is not None
        try:
            text, error = self._read(request.path), ""
        except OSError as exc:
            text, error = "", f"its file could not be read ({exc})"
        except ValueError as exc:
            text, error = "", str(exc)
        try:
            parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)]
            for i, part in enumerate(parts):
                client.set(keys.in_round(self.round, keys.whole_part(request.n, i)), part)
            answer = {"n": request.n, "round": request.round, "rank": self.rank, "parts": len(parts),
                      "sha256": hashlib.sha256(text.encode()).hexdigest(), "error": error}
            client.set_json(keys.in_round(self.round, keys.whole_answer(request.n)),
                            signing.seal(self._key, ANSWER, answer))
        except StoreConnectionError as exc:
            log.info("nbdist: could not send a whole output: %s", exc)
        except Exception:  # never let an answer's bug pass silently: the asker says it got none
            log.exception("nbdist: sending a whole output")
        finally:
            client.close()
            self._busy.release()

    def _read(self, path: str) -> str:
        """One of this rank's own kept files, and no other file of its disk."""
        file = Path(path)
        if file.suffix != ".txt" or file.resolve().parent != self.folder.resolve():
            raise ValueError(f"{path} is not one of its kept outputs")
        try:
            return file.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            raise ValueError(f"its whole output of that cell is no longer kept ({path} was removed: it left the "
                             "world, or newer cells needed the room)") from None


def responder(client: StoreClient, round_: int, rank: int, secret: Callable[[], str], folder: Path) -> Responder:
    """A rank's responder for world round ``round_``: requests made before it joined are not for it."""
    try:
        key: bytes | None = signing.key_from(secret())
    except signing.SigningError:
        key = None
    return Responder(round_, rank, key, folder, seen=client.add(keys.in_round(round_, keys.WHOLE_ASKS), 0))


def ask(client: StoreClient, round_: int, rank: int, path: str, key: bytes, *, where: str,
        gone: Callable[[], str | None] = lambda: None, timeout: float = TIMEOUT) -> str:
    """Rank ``rank``'s kept file ``path``, fetched through the store; ``where`` names the rank in messages, ``gone()``
    says why it cannot answer any more (None: it may). Raises ``LookupError`` saying why there is none."""
    n = client.add(keys.in_round(round_, keys.WHOLE_ASKS), 1)
    ask_key, answer_key = keys.in_round(round_, keys.whole_ask(n)), keys.in_round(round_, keys.whole_answer(n))
    client.set_json(ask_key, signing.seal(key, ASK, Request(n, round_, rank, path).record()))
    deadline = time.monotonic() + timeout
    count = 0
    try:
        while (text := client.get_if(answer_key)) is None:
            if (why := gone()) is not None:
                raise LookupError(f"{where} cannot send its whole output: {why}")
            if time.monotonic() > deadline:
                raise LookupError(f"{where} did not send its whole output within {timeout:g} s")
            time.sleep(0.1)
        answer = records.object_or_none(text)
        if (answer is None or not signing.sealed(key, ANSWER, answer) or answer.get("n") != n
                or answer.get("round") != round_ or answer.get("rank") != rank):
            raise LookupError(f"{where}'s answer did not verify (not signed with this world's key)")
        if answer.get("error"):
            raise LookupError(f"{where}: {answer['error']}")
        if not isinstance(answer.get("parts"), int) or answer["parts"] < 0:
            raise LookupError(f"{where}'s answer is not one nbdist writes")
        count = answer["parts"]
        parts = client.multi_get([keys.in_round(round_, keys.whole_part(n, i)) for i in range(count)]) if count else []
        whole = "".join(parts)
        if hashlib.sha256(whole.encode()).hexdigest() != answer.get("sha256"):
            raise LookupError(f"{where}'s whole output changed on its way (its digest does not match)")
        return whole
    finally:
        for k in [ask_key, answer_key, *(keys.in_round(round_, keys.whole_part(n, i)) for i in range(count))]:
            try:
                client.delete(k)
            except StoreConnectionError:
                break
