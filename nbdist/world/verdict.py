"""What a meeting of the ranks says once it is decided: go, go after a rebuild, refused, or closed by a rank.

A barrier's ``state`` key in the store holds the text; everything in nbdist holds a :class:`Verdict`, and
this module is the one codec between the two. The text, as the store has always held it:

========================  ================================================================
``go``                    the meeting opened: every rank arrived and goes on
``go:with:<found>``       the same, with what the last to arrive found for every rank (its caller's words)
``go:rebuild:<why>``      the meeting opened, and every rank rebuilds its process group first
``refused:<why>``         every rank arrived, and the last to arrive refused (``why`` says why)
``lost:<what>``           closed: a rank found another gone as it waited (what it found: its ``PeerLostError``)
``<who> <reason>``        closed: a rank stopped waiting, or never came (its words)
(unset)                   undecided: ranks are still arriving
========================  ================================================================

Anyone who reaches the store's port can write into it, so :func:`decode` takes any text: what is not
``go``, a rebuild or a refusal reads as closed, with the text as its reason; and whoever reads what a
``go:with:`` says must take any text there too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

_WITH = "go:with:"
_REBUILD = "go:rebuild:"
_REFUSED = "refused:"
_LOST = "lost:"


class Kind(enum.Enum):
    GO = "go"
    REBUILD = "rebuild"
    REFUSED = "refused"
    CLOSED = "closed"


@dataclass(frozen=True)
class Verdict:
    """A decided meeting. ``why``: the rebuild's or the refusal's reason, the closing rank's words, or what the
    last to arrive found as it opened the meeting (a go's: :func:`go`)."""

    kind: Kind
    why: str = ""
    lost: bool = False  # closed by a rank that found another gone: ``why`` is what it found, and every rank says it

    @property
    def said(self) -> str:
        """The verdict in words, for people (a lost peer's as its finder said it)."""
        return self.why if self.lost else self.encode()

    @property
    def opened(self) -> bool:
        """Every rank arrived and goes on (perhaps after a rebuild)."""
        return self.kind in (Kind.GO, Kind.REBUILD)

    @property
    def rebuild(self) -> str | None:
        """Why every rank rebuilds its process group before going on, or None."""
        return self.why if self.kind is Kind.REBUILD else None

    def encode(self) -> str:
        if self.kind is Kind.GO:
            return _WITH + self.why if self.why else "go"
        if self.kind is Kind.REBUILD:
            return _REBUILD + self.why
        if self.kind is Kind.REFUSED:
            return _REFUSED + self.why
        if self.lost:
            return _LOST + self.why
        return self.why or "closed"


GO = Verdict(Kind.GO)


def go(found: str = "") -> Verdict:
    """Go, and tell every rank what the last to arrive ``found`` (read it with the meeting's verdict, no more)."""
    return Verdict(Kind.GO, found) if found else GO


def rebuild(why: str) -> Verdict:
    return Verdict(Kind.REBUILD, why)


def refused(why: str) -> Verdict:
    return Verdict(Kind.REFUSED, why)


def closed(words: str) -> Verdict:
    return Verdict(Kind.CLOSED, words)


def lost(found: str) -> Verdict:
    """Closed by a rank that ``found`` another gone (a ``PeerLostError``'s words): every rank raises it alike, also
    those that do not read that rank's heartbeat (:func:`nbdist.world.liveness.looked_at`)."""
    return Verdict(Kind.CLOSED, found, lost=True)


def decode(text: str | None) -> Verdict | None:
    """The verdict a barrier's state holds; None while it is undecided (unset or empty)."""
    if not text:
        return None
    if text.startswith(_REBUILD):
        return rebuild(text.removeprefix(_REBUILD))
    if text.startswith(_WITH):
        return go(text.removeprefix(_WITH))
    if text == "go" or text.startswith("go:"):  # "go", and any later form of it that opens
        return GO
    if text.startswith(_REFUSED):
        return refused(text.removeprefix(_REFUSED))
    if text.startswith(_LOST):
        return lost(text.removeprefix(_LOST))
    return closed(text)
