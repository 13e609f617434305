"""How a spawned worker's kernel ended (``exited/<i>``), as the notebook that started it tells the other ranks;
validated where it is read (see :mod:`nbdist.world.records`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .records import Fields, MalformedRecord, json_object, value_of, why_not


@dataclass(frozen=True)
class Exited:
    """How the kernel of spawned worker rank ``i`` (its ``pid``) ended, as the notebook that started it saw it:
    ``how`` (its exit code, or the signal by name), the last ``lines`` it wrote, whether it was ``restarted`` and
    what ``then`` became of its slot ("rank 1 was restarted (1 of 3)", or why it was left down), at ``t``
    (``time.time()``)."""

    pid: int
    how: str
    lines: list[str]
    restarted: bool
    then: str
    t: float

    def to_json(self) -> str:
        return json.dumps(value_of(self))

    @classmethod
    def from_json(cls, text: str | None) -> Exited:
        value = json_object(text)
        read = Fields(value)
        pid, how, then, t = read.count("pid"), read.text("how"), read.text("then"), read.time("t")
        restarted = read.flag("restarted")
        why = why_not(value.get("lines", []), [str], "its 'lines'")
        if why:
            raise MalformedRecord(why, value)
        return cls(pid=pid, how=how, lines=list(value.get("lines", [])), restarted=restarted, then=then, t=t)

    @classmethod
    def read(cls, text: str | None) -> Exited | None:
        """The record, or None: unset, or not one (anyone who reaches the port can write there)."""
        if text is None:
            return None
        try:
            return cls.from_json(text)
        except MalformedRecord:
            return None
