"""The records nbdist keeps in the store as JSON, typed: each is a frozen dataclass with one codec.

Anyone who reaches the store's port can write into it, so every record is validated where it is read:
``from_json`` takes any text and returns the record, or raises :class:`MalformedRecord`, whose message
says why the text is not one (for the reader to refuse or ignore it, never a ``KeyError`` later on).

======================  ======================================  ============================================
record                  key (:mod:`.keys`)                      written by, read by
======================  ======================================  ============================================
:class:`Registration`   ``r/<n>/rank/<i>``                      each rank as it claims its slot in a round
                                                                (:mod:`.rendezvous`); every rank of the world
                                                                (``World.ranks``), ``nbdist where``
:class:`Message`        ``drive/<seq>``                         the driving notebook; its followers
                                                                (:mod:`nbdist.drive.follow`), signed
                                                                (:mod:`.signing` covers its ``SIGNED`` fields)
:class:`DriveClaim`     ``drive/claim``                         the notebook that takes the drive; those that
                                                                would take it, its followers
:class:`Refusal`        ``drive/refused``                       a follower that refused a message; the driver
:class:`Failure`        ``t/<n>/failed``,                       a step's first failure, a plain cell's
                        ``plain/failed/<k>``                    (:mod:`nbdist.cell`); every rank, the dashboard
:class:`Arrival`        ``t/<n>/rec/<i>``                       each rank at a step's meeting; the last to
                                                                arrive (:func:`nbdist.world.gather.meet`)
:class:`Note`           ``last/<i>``                            each rank, what it last did; the others'
                                                                waits and messages, %dist_status, the
                                                                dashboard
:class:`StopAll`        ``stops/<n>``                           whoever stops every rank's cell; each rank's
                                                                guard (:mod:`nbdist.cell.guard`)
:class:`Busy`           ``busy/<i>``                            each rank's guard, whether it runs a cell;
                                                                the waits outside cells, the dashboard
:class:`.Exited`        ``exited/<i>``                          the notebook that spawned worker rank i, how
                                                                it ended; the ranks that lose it (kept in
                                                                :mod:`.exited_record`)
:class:`LivePart`       ``t/<n>/live/<i>``                      each rank, its part of a cell's live table;
                                                                the notebooks that show it
                                                                (:mod:`nbdist.cell.live`)
:class:`.Capture`       ``t/<n>/out/<i>``                       each rank, its record of a ``%%collective`` at
                                                                its end; every notebook that shows its table,
                                                                the ranks that wait for it
                                                                (:mod:`nbdist.cell.ending`; kept in
                                                                :mod:`.capture_record`)
======================  ======================================  ============================================

Each keeps the JSON fields the store has always held (fields it does not know are read past), so kernels of
this version and the one before read each other's records.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

from ..errors import NbdistError

_T = TypeVar("_T")


class MalformedRecord(NbdistError, ValueError):
    """Text read from the store is not the record it should be; the message says why.

    ``value``: the JSON object as read, when the text was one (a reader may still name what it claims).
    """

    def __init__(self, why: str, value: dict[str, Any] | None = None) -> None:
        super().__init__(why)
        self.value = value


def json_object(text: str | None) -> dict[str, Any]:
    """``text`` as a JSON object, or raise :class:`MalformedRecord`."""
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise MalformedRecord("not a JSON object")
    return value


def or_none(parse: Callable[[str], _T], text: str | None) -> _T | None:
    """``parse(text)``, or None when the key is unset or its text is not the record (for readers that ignore it)."""
    return _or_none(parse, text)


def object_or_none(text: str | None) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None: unset, or not one (for a value of no schema of its own)."""
    return _or_none(json_object, text)


def shown(value: Any) -> str:
    """``value`` as JSON, cut to 40 characters (for a message that names what a key holds)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Reads the fields of one JSON object, each checked; the first wrong one raises, naming it."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def _get(self, name: str, kind: type[_T], what: str, default: Any = ...) -> _T:
        if name not in self.value:
            if default is not ...:
                return default  # type: ignore[no-any-return]
            raise MalformedRecord(f"it has no {name!r}", self.value)
        got = self.value[name]
        if not isinstance(got, kind) or (isinstance(got, bool) and kind is not bool):  # JSON's true is no number
            raise MalformedRecord(f"its {name!r} is {shown(got)}, not {what}", self.value)
        return got

    def count(self, name: str, least: int = 0) -> int:
        """A whole number, at least ``least`` (``true`` is not one, though Python counts it as 1)."""
        got = self._get(name, int, "a whole number")
        if got < least:
            raise MalformedRecord(f"its {name!r} is {got}, below {least}", self.value)
        return got

    def text(self, name: str, default: Any = ...) -> str:
        return self._get(name, str, "text", default)

    def time(self, name: str) -> float:
        """Seconds since the epoch (a whole number will do)."""
        if name not in self.value:
            raise MalformedRecord(f"it has no {name!r}", self.value)
        got = self.value[name]
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not got >= 0:  # not NaN either
            raise MalformedRecord(f"its {name!r} is {shown(got)}, not a time", self.value)
        return float(got)

    def number(self, name: str, default: Any = ...) -> float:
        """A number (a whole one will do; ``true`` is not one)."""
        if name not in self.value and default is not ...:
            return float(default)
        got = self.value.get(name)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise MalformedRecord(f"its {name!r} is {shown(got)}, not a number", self.value)
        return float(got)

    def objects(self, name: str) -> list[dict[str, Any]]:
        """A list of JSON objects."""
        got = self._get(name, list, "a list")
        if not all(isinstance(v, dict) for v in got):
            raise MalformedRecord(f"its {name!r} holds something other than JSON objects", self.value)
        return list(got)

    def flag(self, name: str) -> bool:
        return self._get(name, bool, "true or false")

    def object(self, name: str) -> dict[str, Any]:
        got = self._get(name, dict, "a JSON object")
        return dict(got)

    def one_of(self, name: str, allowed: tuple[str, ...]) -> str:
        got = self.text(name)
        if got not in allowed:
            raise MalformedRecord(f"its {name!r} is {shown(got)}, not one of {', '.join(allowed)}", self.value)
        return got


Fields = _Fields  # for a record kept next to its one user, where this module would have to import upward


def _or_none(parse: Callable[[str], _T], text: str | None) -> _T | None:
    """``parse(text)``, or None when the key is unset or its text is not the record (for readers that ignore it)."""
    try:
        return None if text is None else parse(text)
    except MalformedRecord:
        return None


def _value(record: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record's fields in their order, as a JSON object (``leave_out``: fields the JSON omits)."""
    return {f.name: getattr(record, f.name) for f in fields(record) if f.name not in leave_out}


value_of = _value  # for a record kept in a module of its own


# --- drive/<seq>: a message of the driving notebook -----------------------------------------------

MESSAGE_KINDS = ("collective", "barrier", "release")


@dataclass(frozen=True)
class Message:
    """One message of the driving notebook to its followers: a cell, a barrier, or the end of driving.

    ``round``, ``seq``: the world round and the message's number; ``driver``, ``session``: the rank that
    sends it and its kernel; ``number``: the world's step the cell or barrier is (0 for a release);
    ``gen``: the group's generation then; ``t``: when it was sent (unsigned); ``sig``: the signature
    (:func:`nbdist.world.signing.sign`, over the fields named in ``signing.SIGNED``).
    """

    round: int
    seq: int
    driver: int
    session: str
    kind: str
    source: str
    flags: dict[str, Any]
    gen: int
    number: int
    t: float
    sig: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The record as the JSON object the store holds (what :mod:`.signing` signs and verifies)."""
        return _value(self)

    def signed(self, sig: str) -> Message:
        return replace(self, sig=sig)

    def to_json(self) -> str:
        return json.dumps(_value(self))

    @classmethod
    def from_json(cls, text: str | None) -> Message:
        read = _Fields(json_object(text))
        return cls(round=read.count("round"), seq=read.count("seq"), driver=read.count("driver"),
                   session=read.text("session"), kind=read.one_of("kind", MESSAGE_KINDS),
                   source=read.text("source"), flags=read.object("flags"), gen=read.count("gen"),
                   number=read.count("number"), t=read.time("t"), sig=read.text("sig", ""))


# --- drive/claim: who drives the world ----------------------------------------------------------

@dataclass(frozen=True)
class DriveClaim:
    """The notebook that holds the drive of a world: its ``rank`` and its kernel (``session``). Its JSON is the
    text compared and set (``compare_set``) to take and give back the drive, so it is always written alike."""

    rank: int
    session: str

    def as_dict(self) -> dict[str, Any]:
        """As the driver :func:`.signing.verify` checks a message against."""
        return _value(self)

    def to_json(self) -> str:
        return json.dumps(_value(self))

    @classmethod
    def from_json(cls, text: str | None) -> DriveClaim:
        read = _Fields(json_object(text))
        return cls(rank=read.count("rank"), session=read.text("session"))

    @classmethod
    def read(cls, text: str | None) -> DriveClaim | None:
        """Who holds the drive, or None: no one ("" once given back), or not a claim (anyone can write there: read
        as held by no one, which the next notebook to drive takes over as one whose kernel is gone)."""
        return None if not text else _or_none(cls.from_json, text)


# --- drive/refused: a follower's refusal ---------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """A follower (``rank``) refused message ``seq`` and stopped following; ``reason``: why."""

    rank: int
    seq: int
    reason: str

    def to_json(self) -> str:
        return json.dumps(_value(self))

    @classmethod
    def from_json(cls, text: str | None) -> Refusal:
        read = _Fields(json_object(text))
        return cls(rank=read.count("rank"), seq=read.count("seq"), reason=read.text("reason"))


# --- t/<n>/failed: a step's first failure --------------------------------------------------------

# error: a rank's cell raised; interrupted: its stop button; mismatch: different collectives; max-time: its
# --max-time ran out; lost: a rank is gone; stopped: %dist_stop or nbdist stop (of every rank).
FAILURE_KINDS = ("error", "interrupted", "mismatch", "max-time", "lost", "stopped")
WORLD = -1  # the rank of a failure that no one rank caused (a lost rank, a stop of every rank)


@dataclass(frozen=True)
class Failure:
    """The first failure of a step: which rank (:data:`WORLD` for none), what kind, its message.

    ``unstarted``: the digest of the cell's body when that rank's cell never reached the protocol
    (:func:`nbdist.cell.turn.refuse_if_peer_did_not_start`); else None, and left out of the JSON.
    """

    rank: int
    kind: str
    message: str
    unstarted: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The record as the JSON object the store holds (the form a cell's reason for stopping has, so far)."""
        return _value(self, leave_out=("unstarted",) if self.unstarted is None else ())

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str | None) -> Failure:
        return cls.from_dict(json_object(text))

    @classmethod
    def read(cls, text: str | None) -> Failure | None:
        """The failure a step's key holds, or None: unset, or not a failure (anyone can write there: ignored)."""
        return _or_none(cls.from_json, text)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Failure:
        """A failure from a JSON object (one read from the store, or a reason a cell holds as a dict)."""
        read = _Fields(value)
        return cls(rank=read.count("rank", least=WORLD), kind=read.one_of("kind", FAILURE_KINDS),
                   message=read.text("message"), unstarted=read.text("unstarted", None))


# --- t/<n>/rec/<i>: a rank's arrival at a step's meeting --------------------------------------------

STEP_KINDS = ("cell", "barrier", "rebuild")


@dataclass(frozen=True)
class CellStart:
    """What a rank runs a ``%%collective`` with, for the last to arrive to compare
    (:func:`nbdist.cell.cells.start_verdict`): its body's ``hash`` and ``code`` (cut to a size), its process
    group's state ``pg`` (as the others judge it: :func:`nbdist.cell.rebuild.state`), and the flags every rank
    must give alike (``Flags.compared``)."""

    hash: str
    code: str
    pg: dict[str, Any]
    flags: dict[str, Any]


@dataclass(frozen=True)
class Arrival:
    """A rank at a step's meeting: the ``kind`` of step it reached, the ``label`` that names it for people, and, for a
    ``%%collective``, what it runs it with (``cell``; its fields come first in the JSON, as they always have)."""

    kind: str
    label: str
    cell: CellStart | None = None

    def to_json(self) -> str:
        return json.dumps({**({} if self.cell is None else _value(self.cell)), "kind": self.kind, "label": self.label})

    @classmethod
    def from_json(cls, text: str | None) -> Arrival:
        read = _Fields(json_object(text))
        kind = read.one_of("kind", STEP_KINDS)
        cell = (CellStart(hash=read.text("hash"), code=read.text("code"), pg=read.object("pg"),
                          flags=read.object("flags")) if kind == "cell" else None)
        return cls(kind=kind, label=read.text("label"), cell=cell)


# --- last/<i>: what a rank last did ----------------------------------------------------------------

@dataclass(frozen=True)
class Note:
    """What a rank last did, in words (``what``), noted at ``t`` (``time.time()``), for the others' waits and
    messages, ``%dist_status`` and the dashboard; replaced by the next, never removed.

    ``barrier``: the store name of the barrier it waits at, ``then``: what to say instead once that barrier
    opened (the rank notes again only when it runs on), ``turn``: the step that barrier is; ``cell``: the step of
    the ``%%collective`` it runs or finished, ``body``: that cell's store name while it runs the body;
    ``collective``: the torch collective it has been inside for long (its watch). Fields left None are left out
    of the JSON.
    """

    what: str
    t: float
    barrier: str | None = None
    then: str | None = None
    turn: int | None = None
    cell: int | None = None
    body: str | None = None
    collective: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in _value(self).items() if v is not None})

    @classmethod
    def from_json(cls, text: str | None) -> Note:
        read = _Fields(json_object(text))
        return cls(what=read.text("what"), t=read.time("t"), barrier=read.text("barrier", None),
                   then=read.text("then", None), turn=read.count("turn") if "turn" in read.value else None,
                   cell=read.count("cell") if "cell" in read.value else None, body=read.text("body", None),
                   collective=read.text("collective", None))

    @classmethod
    def read(cls, text: str | None) -> Note | None:
        """The note a rank's key holds, or None: none yet, or not a note (anyone can write there: read as none)."""
        return _or_none(cls.from_json, text)


# --- error: why a round of the world cannot form ------------------------------------------------------

def world_error(text: str) -> str:
    """What a round's error record (``error``, written once by the rank that found the round cannot form: world
    sizes that disagree) says, for every rank's join to fail with; a record that is not nbdist's fails it too,
    naming what it holds (the round is marked failed either way)."""
    value = _or_none(json_object, text)
    message = None if value is None else value.get("message")
    return message if isinstance(message, str) else f"this round of the world is marked failed: {shown(text)}"


# --- stops/<n>: a stop of every rank -----------------------------------------------------------------

@dataclass(frozen=True)
class StopAll:
    """A stop of every rank's running cell (``%dist_stop``, ``nbdist stop``, the dashboard's button): what the
    ranks' cells end with (``message``), the kernel that sent it (``session``; "" from a terminal), and when
    (``t``, ``time.time()``: a stop sent before a cell began is not for it)."""

    message: str
    session: str
    t: float

    def to_json(self) -> str:
        return json.dumps(_value(self))

    @classmethod
    def from_json(cls, text: str | None) -> StopAll:
        read = _Fields(json_object(text))
        return cls(message=read.text("message"), session=read.text("session", ""), t=read.time("t"))


# --- busy/<i>: whether a rank runs a cell -----------------------------------------------------------

@dataclass(frozen=True)
class Busy:
    """Whether a rank runs a cell (``busy``), written by its guard when that changes, at ``t`` (``time.time()``):
    for a barrier outside cells to wait for a rank still in one, and for what a wait's message and the dashboard
    say a missing rank does."""

    busy: bool
    t: float

    def to_json(self) -> str:
        return json.dumps(_value(self))

    @classmethod
    def from_json(cls, text: str | None) -> Busy:
        read = _Fields(json_object(text))
        return cls(busy=read.flag("busy"), t=read.time("t"))

    @classmethod
    def read(cls, text: str | None) -> Busy | None:
        """What a rank's key holds, or None: nothing yet, or not the record (read as nothing known)."""
        return _or_none(cls.from_json, text)


# --- t/<n>/live/<i>: a rank's part of a cell's live table ------------------------------------------

LIVE_STATES = ("running", "finished", "failed")


@dataclass(frozen=True)
class LivePart:
    """One rank's part of a cell's live table: its ``state``, what its body printed and showed so far
    (``outputs``, as :class:`nbdist.cell.outputlog.OutputLog` snapshots them), and, running, ``where`` its body is
    (:func:`nbdist.cell.live.where`); ended, its body's ``wall`` seconds and, failed, ``why`` (the error's name).
    Empty ``where`` and ``why`` and a zero ``wall`` are left out of the JSON."""

    state: str
    outputs: list[dict[str, Any]]
    where: str = ""
    wall: float = 0.0
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The record as the JSON object the store holds (before it is cut to size: :func:`nbdist.view.shrink.fit`)."""
        value = _value(self)
        return {k: v for k, v in value.items() if v or k in ("state", "outputs")}

    @classmethod
    def from_json(cls, text: str | None) -> LivePart:
        read = _Fields(json_object(text))
        return cls(state=read.one_of("state", LIVE_STATES), outputs=read.objects("outputs"),
                   where=read.text("where", ""), wall=read.number("wall", 0.0), why=read.text("why", ""))


# --- the shape of a JSON value, checked (the records whose fields nest) --------------------------------

NUMBER = float  # in a shape: an int or a float, never JSON's true or false


class Object:
    """The shape of a JSON object: the fields it must have and those it may have, each with its shape; fields
    not named are read past (a later version's)."""

    def __init__(self, must: dict[str, Any], may: dict[str, Any] | None = None) -> None:
        self.must, self.may = must, may or {}


def why_not(value: Any, shape: Any, name: str) -> str | None:
    """Why ``value`` (the record's ``name``) does not have ``shape``; None when it does.

    A shape is ``str``, ``int``, ``bool`` or ``NUMBER``; ``[shape]``, a list of them; ``{str: shape}``, an object
    of them; an :class:`Object`; or ``None``, anything.
    """
    if shape is None:
        return None
    if isinstance(shape, Object):
        if not isinstance(value, dict):
            return f"{name} is {shown(value)}, not a JSON object"
        for key in shape.must:
            if key not in value:
                return f"{name} has no {key!r}"
        for key, inner in {**shape.must, **shape.may}.items():
            if key in value and (why := why_not(value[key], inner, f"{name}[{key!r}]")):
                return why
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{name} is {shown(value)}, not a list"
        return next((why for i, v in enumerate(value) if (why := why_not(v, shape[0], f"{name}[{i}]"))), None)
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{name} is {shown(value)}, not a JSON object"
        return next((why for k, v in value.items() if (why := why_not(v, shape[str], f"{name}[{k!r}]"))), None)
    if shape is NUMBER:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        fits = isinstance(value, shape) and (shape is bool or not isinstance(value, bool))
    what = {str: "text", int: "a whole number", bool: "true or false", NUMBER: "a number"}[shape]
    return None if fits else f"{name} is {shown(value)}, not {what}"


# --- r/<n>/rank/<i>: a rank's registration in a round ----------------------------------------------

@dataclass(frozen=True)
class Registration:
    """A rank's claim of its slot in a round, and what the others learn of it once the world formed
    (``World.ranks``): its kernel (``session``), ``rank``, ``host``, ``pid``; what runs it (``process``: "kernel" or
    "nbdist follow"), its ``node`` (ranks on one node share devices), its end of its route to the master (``addr``)
    and its other addresses (``addrs``); the versions of ``nbdist``, ``torch`` and ``python``; its ``backend`` (and
    ``backend_reason``), ``device`` (``device_chosen``: by --device), ``torch_npu`` and ``cann`` (None: absent);
    the values every rank must give alike (``agreed``), its environment's plan (``env``); whether its heartbeat
    stays in the store once it stops (``keeps_beat``: the version before removes it); whether a driving notebook
    started it and starts it again if it dies (``spawned``: a worker of ``%dist_init --spawn``, which says how it
    ended in an :class:`.Exited`); and ``nonce``, which tells its own claim from another's. Only ``session``,
    ``rank``, ``host`` and ``pid`` must be there: the rest have defaults for a kernel of an earlier version.
    """

    session: str
    rank: int
    host: str
    pid: int
    process: str = "kernel"
    node: str = ""
    addr: str = ""
    addrs: list[str] = field(default_factory=list)
    nbdist: str = ""
    torch: str = ""
    python: str = ""
    backend: str = ""
    backend_reason: str = ""
    device: str = ""
    device_chosen: bool = False
    torch_npu: str | None = None
    cann: str | None = None
    agreed: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)
    keeps_beat: bool = False
    spawned: bool = False
    nonce: str = ""

    _SHAPES: ClassVar[dict[str, Any]] = {"process": str, "node": str, "addr": str, "addrs": [str], "nbdist": str,
                                         "torch": str, "python": str, "backend": str, "backend_reason": str,
                                         "device": str, "device_chosen": bool, "agreed": {str: str}, "env": [str],
                                         "keeps_beat": bool, "spawned": bool, "nonce": str}

    def as_dict(self) -> dict[str, Any]:
        """The record as the JSON object the store holds (the views take a rank's registration as one)."""
        return _value(self)

    def to_json(self) -> str:
        return json.dumps(_value(self))

    @classmethod
    def from_json(cls, text: str | None) -> Registration:
        value = json_object(text)
        read = _Fields(value)
        session, rank, host, pid = read.text("session"), read.count("rank"), read.text("host"), read.count("pid")
        for name, shape in (*cls._SHAPES.items(), ("torch_npu", str), ("cann", str)):
            if name in value and not (value[name] is None and name in ("torch_npu", "cann")) and (
                    why := why_not(value[name], shape, f"its {name!r}")):
                raise MalformedRecord(why, value)
        return cls(session=session, rank=rank, host=host, pid=pid,
                   **{name: value[name] for name in (*cls._SHAPES, "torch_npu", "cann") if name in value})

    @classmethod
    def read(cls, text: str | None) -> Registration | None:
        """The registration a slot holds, or None: unset, withdrawn (""), or not a registration (anyone can write
        there: the rendezvous takes such a slot as held by no one alive)."""
        return None if not text else _or_none(cls.from_json, text)
