"""A rank's record of a ``%%collective`` at its end (``t/<n>/out/<i>``), validated where it is read: what each
rank printed, showed, returned and raised, and what the end compares (see :mod:`nbdist.world.records`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .records import NUMBER, Fields, MalformedRecord, Object, json_object, or_none, shown, value_of, why_not

OUTPUT_KINDS = ("stdout", "stderr", "note", "display")

_BUNDLE = {str: str}  # a MIME bundle: text by MIME type (images as base64), as nbdist passes them on
_TEXT_OUTPUT = Object({"kind": str, "text": str})
_DISPLAY_OUTPUT = Object({"kind": str, "data": _BUNDLE})
_ERROR = Object({"ename": str, "evalue": str}, {"traceback": str, "short": str, "where": str, "interrupted": bool,
                                                "consequence": bool, "held": [str]})
_GROUP_STATE = Object({"ok": bool}, {"why": str, "groups": [str], "calls": {str: int}, "seq": {str: int}})
_CHECKS = Object({"groups": {str: Object({"n": int, "h": int, "runs": [[int]]}, {"truncated": bool})},
                   "sigs": {str: {str: None}}})
_KEPT = Object({"path": str, "host": str, "chars": int, "lines": int}, {"capped": str})
_TRACED = Object({"group": str, "seq": int, "op": str, "enter": NUMBER, "leave": NUMBER}, {"bytes": int})


@dataclass(frozen=True)
class Raised:
    """What a rank's body raised, as its capture records it and its column shows it: ``ename``, ``evalue``, the full
    ``traceback``, ``short`` (the user's frames), ``where`` (the innermost line of the user's code); whether the stop
    button ended it (``interrupted``), or it followed from the cell being cut elsewhere (``consequence``). Fields
    left None are not said, and left out of the JSON (a failed capture's error says no ``where``; ``consequence`` is
    said only once another rank cut the cell); ``held``: with a ``NameError`` of a kernel that took over a rank's
    slot, the names it holds (:mod:`nbdist.cell.names`)."""

    ename: str
    evalue: str
    traceback: str | None = None
    short: str | None = None
    where: str | None = None
    interrupted: bool | None = None
    consequence: bool | None = None
    held: list[str] | None = None  # with a NameError, the names of a kernel that took over a slot

    def as_dict(self) -> dict[str, str | bool | list[str]]:
        return {k: v for k, v in value_of(self).items() if v is not None}


@dataclass(frozen=True)
class Capture:
    """One rank's record of a ``%%collective`` at its end (:mod:`nbdist.cell.ending`), read by every notebook
    that shows the cell's table and by the ranks that wait for it (a rank that ended its body publishes it).

    ``outputs``: what its body printed and showed, in order, each ``{"kind": "stdout"|"stderr"|"note", "text"}``
    or ``{"kind": "display", "data": bundle}`` (a bundle: text by MIME type); ``result``: the body's value as a
    bundle; ``error``: what it raised (:class:`Raised`); ``wall``: the body's seconds; ``rank``;
    ``collectives``: how many of each it issued; ``checks``: its collectives' histories, for the end's
    comparison; ``trace``: its traced calls; ``pg``: its process group's state
    (:meth:`nbdist.backend.procgroup.ProcessGroup.state`); ``cancelled``: why the cell was cut short here; ``kept``:
    where its whole output is, when ``outputs`` left some out (:mod:`nbdist.cell.wholeoutput`).
    :func:`nbdist.cell.capture.run_cell` makes the first four; the cell adds the rest as it publishes it. Its one
    codec is :meth:`as_dict` (the JSON object the store holds: fields left None are left out, but ``result`` and
    ``error``) and :meth:`from_dict`; the views read it as it is, by its fields.
    """

    outputs: list[dict[str, Any]]
    result: dict[str, str] | None
    error: Raised | None
    wall: float
    rank: int | None = None
    collectives: dict[str, int] | None = None
    checks: dict[str, Any] | None = None
    trace: list[dict[str, Any]] | None = None
    pg: dict[str, Any] | None = None
    cancelled: str | None = None
    kept: dict[str, Any] | None = None

    _SHAPES: ClassVar[dict[str, Any]] = {"rank": int, "collectives": {str: int}, "pg": _GROUP_STATE,
                                         "checks": _CHECKS, "trace": [_TRACED], "cancelled": str, "kept": _KEPT}

    def as_dict(self) -> dict[str, Any]:
        """The record as the JSON object the store holds (:func:`nbdist.view.shrink.fit` cuts it to size)."""
        value = {**value_of(self), "error": None if self.error is None else self.error.as_dict()}
        return {k: v for k, v in value.items() if v is not None or k in ("result", "error")}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Capture:
        read = Fields(value)
        outputs = read.objects("outputs")
        for i, out in enumerate(outputs):
            kind = out.get("kind")
            if kind not in OUTPUT_KINDS:
                raise MalformedRecord(f"its 'outputs'[{i}]['kind'] is {shown(kind)}, not one of "
                                      f"{', '.join(OUTPUT_KINDS)}", value)
            if why := why_not(out, _DISPLAY_OUTPUT if kind == "display" else _TEXT_OUTPUT, f"its 'outputs'[{i}]"):
                raise MalformedRecord(why, value)
        for name, shape in (("result", _BUNDLE), ("error", _ERROR), *cls._SHAPES.items()):
            if value.get(name) is not None and (why := why_not(value[name], shape, f"its {name!r}")):
                raise MalformedRecord(why, value)
        if "result" not in value or "error" not in value:
            raise MalformedRecord(f"it has no {'result' if 'result' not in value else 'error'!r}", value)
        error = value["error"]
        raised = None if error is None else Raised(**{f.name: error.get(f.name) for f in fields(Raised)})
        return cls(outputs=outputs, result=value["result"], error=raised, wall=read.number("wall"),
                   **{name: value.get(name) for name in cls._SHAPES})

    @classmethod
    def from_json(cls, text: str | None) -> Capture:
        return cls.from_dict(json_object(text))

    @classmethod
    def read(cls, text: str | None) -> Capture | None:
        """The record a rank published, or None: none yet, or not a record (anyone can write there: read as none,
        which every table shows as a rank that sent no result)."""
        return or_none(cls.from_json, text)
