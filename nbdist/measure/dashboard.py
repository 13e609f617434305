"""%dist_dashboard: every rank of the world, live, in an ipywidgets panel.

Three parts, in the order the data flows:

1. :class:`Reader` reads what the store holds about each rank, on a connection of
   its own (a clone of the session's, as the watcher has): its heartbeat, its
   ``last/<rank>`` note (what it does, which barrier it waits at, which
   collective it is inside), whether it runs a cell (``busy/<rank>``), whether it
   left, and the failures recorded for the cells it is in (``<cell>/failed``).
2. :func:`rows` turns those records into one :class:`Row` per rank: pure, no I/O.
3. :class:`Dashboard` shows the rows (:func:`render_html` in the widget,
   :func:`render_text` as the output's text/plain) and updates them from a
   background thread at most twice a second, while other cells of this
   notebook run. The main thread is never blocked: the thread reads the store,
   and only the widget's traits are set. Its button does what ``%dist_stop``
   does. :meth:`Dashboard.stop` is idempotent and joins the thread.
"""

from __future__ import annotations

import atexit
import html
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import NbdistError, StoreConnectionError
from ..ranksets import fold
from ..view.display import CELL_STYLE, DIFF_STYLE, GROUP_ABOVE, TABLE_STYLE
from ..view.numbers import fold_alike
from ..world import keys, records
from ..world.liveness import DEAD_AFTER
from ..world.pulse import BUSY_AFTER, Beat, beat_from
from ..world.records import Registration
from ..world.store import StoreClient
from ..world.world import World

log = logging.getLogger(__name__)

UPDATE_EVERY = 0.5  # seconds between updates: at most twice a second
STORE_TIMEOUT = 2.0  # seconds one read of the dashboard's own connection may take
JOIN_TIMEOUT = 2 * UPDATE_EVERY + 2 * STORE_TIMEOUT  # a stopping thread ends its update first
COLUMNS = ("rank", "state", "heartbeat", "host", "device", "doing", "last error")
BUTTON_NOTE = "acts once this kernel is idle (while a cell runs here, the toolbar's stop button ends it)"
_CELL = re.compile(r"^(t/\d+)(?:/|$)")
_CELL_NUMBER = re.compile(r"^t/(\d+)$")
_IN_PROTOCOL = ("running", "inside", "waiting", "joining", "rejoined", "rebuilding")


@dataclass(frozen=True)
class Seen:
    """What the store held about one rank at one moment (None where nothing was stored)."""

    info: Registration  # the rank's registration: host, device, pid, session
    left: bool = False
    beat: Beat | None = None  # hb/<session>
    last: records.Note | None = None  # r/<round>/last/<rank>
    busy: records.Busy | None = None  # r/<round>/busy/<rank>
    error: str = ""  # the last failure this rank caused, as shown


@dataclass(frozen=True)
class Row:
    """One rank, as the dashboard shows it; ``trouble`` rows (left, gone, not responding) are marked."""

    rank: int
    state: str
    heartbeat: str
    host: str
    device: str
    doing: str
    error: str
    trouble: bool

    def cells(self) -> tuple[str, ...]:
        return (str(self.rank), self.state, self.heartbeat, self.host, self.device, self.doing, self.error)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def _state(seen: Seen, age: float | None, dead_after: float) -> str:
    if seen.left:
        return "left"
    if seen.beat is not None and seen.beat.gone:
        return "gone"
    if age is None or age > dead_after:
        return "not responding"
    return "joined"


def _heartbeat(beat: Beat | None, age: float | None, dead_after: float) -> str:
    if beat is None or age is None:
        return "none"
    if beat.gone:
        return "gone: its kernel exited"
    if age > dead_after:
        return f"none for {_seconds(age)}"
    busy = beat.busy
    held = f" · Python held {_seconds(busy)}" if busy > BUSY_AFTER else ""  # inside one long C call
    return f"{_seconds(age)} ago{held}"


def _doing(last: records.Note | None, busy: records.Busy | None, now: float) -> str:
    """What a rank does: a %%collective's number and what it is inside or waits at, else whether a cell runs.

    A note says what the rank began; ``busy`` (its guard's, every 0.2 s) says whether a cell still runs.
    A note of a wait or a body that is older than a "no cell runs" is over: its cell was stopped.
    """
    running = busy is not None and busy.busy
    if last is None:
        return "running a cell" if running else ""
    what, noted = last.what, last.t
    since = _seconds(max(0.0, now - noted))
    over = busy is not None and not running and busy.t >= noted
    if (what.startswith(_IN_PROTOCOL) or last.barrier is not None) and not over:
        return f"{what} · {since}"
    if running:
        return f"running a cell · last: {what}, {since} ago"
    return f"idle · last: {what}, {since} ago"


def rows(seen: list[Seen], now: float, dead_after: float = DEAD_AFTER) -> list[Row]:
    """One row per rank from what the store held; ``now`` is ``time.time()`` (the records' clock)."""
    out = []
    for rank, s in enumerate(seen):
        age = None if s.beat is None else max(0.0, now - s.beat.t)
        state = _state(s, age, dead_after)
        out.append(Row(
            rank=rank, state=state, heartbeat=_heartbeat(s.beat, age, dead_after),
            host=s.info.host, device=s.info.device,
            doing="" if state == "left" else _doing(s.last, s.busy, now), error=s.error,
            trouble=state != "joined",
        ))
    return out


def cell_of(last: records.Note | None) -> str | None:
    """The store name of the %%collective (the world's step) a rank's note is about ("t/3"), or None."""
    if last is None:
        return None
    for name in (last.body, last.barrier):
        match = _CELL.match(name or "")
        if match:
            return match[1]
    return None if last.cell is None else keys.step(last.cell)


def previous_cell(cell: str) -> str | None:
    """The step before ``cell`` (its failure may have been recorded between two looks)."""
    match = _CELL_NUMBER.match(cell)
    if match is None or int(match[1]) <= 1:
        return None
    return keys.step(int(match[1]) - 1)


def failure_text(failure: records.Failure, cell: str, describe: str) -> str:
    """A cell's recorded failure as a rank's "last error": the cell, then the message without the rank's name."""
    match = _CELL_NUMBER.match(cell)
    where = f"%%collective #{match[1]}" if match else cell
    return f"{where}: {failure.message.removeprefix(describe).lstrip()}"


def shown(table: list[Row]) -> list[tuple[tuple[str, ...], bool]]:
    """(cells, trouble) per line: a line per rank, or past :data:`GROUP_ABOVE` ranks, a line per group of alike ranks.

    Alike: equal once their numbers are taken out (a heartbeat's age); such a
    line says ``⟨min … max⟩`` where its ranks' numbers differ, and its rank set.
    """
    if len(table) <= GROUP_ABOVE:
        return [(row.cells(), row.trouble) for row in table]
    trouble = {row.rank: row.trouble for row in table}
    groups = fold_alike([row.cells()[1:] for row in table], [row.rank for row in table])
    return [((fold(ranks), *fields), any(trouble[r] for r in ranks)) for ranks, fields in groups]


def render_html(title: str, table: list[Row], footer: list[str] | None = None) -> str:
    """The rows as static HTML (no script; every value escaped), styled like the side-by-side table."""
    head = "".join(f'<th style="{CELL_STYLE}">{html.escape(c)}</th>' for c in COLUMNS)
    body = []
    for cells, trouble in shown(table):
        style = f"{CELL_STYLE};{DIFF_STYLE}" if trouble else CELL_STYLE
        tds = [f'<td style="{style}{";white-space:nowrap" * (j < len(COLUMNS) - 1)}">{html.escape(c)}</td>'
               for j, c in enumerate(cells)]  # one line per rank (or group); only the error may wrap
        body.append(f"<tr>{''.join(tds)}</tr>")
    foot = "".join(f"<div><small>{html.escape(line)}</small></div>" for line in footer or [])
    return (f'<div class="nbdist nbdist-dashboard"><div><b>{html.escape(title)}</b></div>'
            f'<table style="{TABLE_STYLE}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>{foot}</div>")


def render_text(title: str, table: list[Row], footer: list[str] | None = None) -> str:
    """The rows as aligned text: the snapshot where widgets do not render."""
    grid = [COLUMNS, *(cells for cells, _ in shown(table))]
    widths = [max(len(line[j]) for line in grid) for j in range(len(COLUMNS))]
    lines = [title, *("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in grid)]
    return "\n".join([*lines, *(footer or [])])


class Reader:
    """Reads the world's records for the dashboard, on a connection it owns (never the session's)."""

    def __init__(self, client: StoreClient, world: World) -> None:
        self.client, self.world = client, world
        self._failures: dict[str, records.Failure] = {}  # cell -> its failure (written once: the first wins)

    def _failure(self, cell: str) -> records.Failure | None:
        if cell not in self._failures:
            key = self.world.key(keys.failed(cell))
            # check() first: a read of a missing key through compare_set would wake the waits on it.
            failure = records.Failure.read(self.client.get_if(key)) if self.client.check([key]) else None
            if failure is None:
                return None
            self._failures[cell] = failure
        return self._failures[cell]

    def errors(self, lasts: list[records.Note | None]) -> tuple[dict[int, str], str]:
        """Each rank's latest failure among the cells the ranks are at (and before), and the world's last stop.

        A failure names the rank that caused it; one that names none (%dist_stop, a lost rank) is the world's.
        """
        world = self.world
        cells = {c for last in lasts if (c := cell_of(last)) is not None}
        cells |= {p for c in cells if (p := previous_cell(c)) is not None}
        latest: dict[int, tuple[int, str]] = {}  # rank (-1: the world's) -> (step, text)
        for cell in cells | set(self._failures):
            failure = self._failure(cell)
            match = _CELL_NUMBER.match(cell)
            if failure is None or match is None:
                continue
            order = int(match[1])
            owner = failure.rank if failure.rank < len(world.ranks) else records.WORLD
            if owner not in latest or latest[owner][0] < order:
                latest[owner] = (order, failure_text(failure, cell, world.describe(owner) if owner >= 0 else ""))
        stop = latest.pop(-1, None)
        return {rank: text for rank, (_, text) in latest.items()}, stop[1] if stop else ""

    def read(self) -> tuple[list[Seen], str]:
        """Every rank's records, and the last failure of the world that no one rank caused (a stop, a lost rank)."""
        world, client = self.world, self.client
        ranks = list(world.ranks)
        lasts = [records.Note.read(client.get_if(world.key(keys.last(i)))) for i in range(len(ranks))]
        errors, stop = self.errors(lasts)
        seen = []
        for i, info in enumerate(ranks):
            seen.append(Seen(
                info=info, left=client.check([world.key(keys.left(i))]),
                beat=beat_from(client.get_if(keys.heartbeat(info.session))), last=lasts[i],
                busy=records.Busy.read(client.get_if(world.key(keys.busy(i)))), error=errors.get(i, ""),
            ))
        return seen, stop


def _title(world: World, when: float) -> str:
    return (f"nbdist dashboard · {world.world_size} rank(s) · round {world.round} · this notebook is rank "
            f"{world.rank} · updated {time.strftime('%H:%M:%S', time.localtime(when))}")


class Watched(Protocol):
    """What the dashboard reads and calls: the kernel's session, in these parts."""

    @property
    def shell(self) -> Any: ...  # IPython's, for its display publisher

    @property
    def world(self) -> World | None: ...  # read by the dashboard's thread: it stops when this changes

    def require_world(self, what: str) -> World: ...

    def stop_all(self) -> int: ...


def snapshot(session: Watched) -> str:
    """One text snapshot of every rank, read now on the kernel's main thread (``%dist_dashboard --once``)."""
    world = session.require_world("%dist_dashboard")
    seen, stop = Reader(world.client, world).read()
    now = time.time()
    return render_text(_title(world, now), rows(seen, now), [f"last stop: {stop}"] if stop else [])


class Dashboard:
    """The live panel of one world: widgets, their text snapshot, and the thread that updates them."""

    def __init__(self, session: Watched, client: StoreClient, publisher: Any,
                 stop_all: Callable[[], int], interval: float = UPDATE_EVERY) -> None:
        import ipywidgets as widgets

        self.session, self.world = session, session.require_world("%dist_dashboard")
        self.interval = max(UPDATE_EVERY, interval)
        self.updates = 0  # how many times the panel was drawn
        self.stopped: str | None = None  # why it stopped, once it did
        self._reader = Reader(client, self.world)
        self._client = client
        self._publisher = publisher  # the kernel's, taken at the start: a %%collective replaces shell.display_pub
        self._stop_all = stop_all
        self._display_id = uuid.uuid4().hex
        self._halt = threading.Event()
        self._lock = threading.Lock()  # one drawing at a time: the thread's, or stop()'s last one
        self._text = ""
        self._table = widgets.HTML()
        self._status = widgets.HTML(f"<small>{html.escape(BUTTON_NOTE)}</small>", layout={"margin": "0 0 0 8px"})
        self._button = widgets.Button(description="stop all ranks", button_style="danger", icon="stop",
                                      tooltip="%dist_stop: end the cell every other rank is running, within 2 s")
        self._button.on_click(self._clicked)
        self.widget = widgets.VBox([self._table, widgets.HBox([self._button, self._status])])
        self.widget.add_class("nbdist-dashboard")
        self._thread = threading.Thread(target=self._run, name="nbdist-dashboard", daemon=True)

    @classmethod
    def start(cls, session: Watched) -> Dashboard:
        """Draw the panel once, then keep it up to date from a thread (call on the kernel's main thread)."""
        world = session.require_world("%dist_dashboard")
        client = world.client.clone(op_timeout=STORE_TIMEOUT)
        try:
            dash = cls(session, client, session.shell.display_pub, session.stop_all)
            dash._update()
        except BaseException:
            client.close()
            raise
        atexit.register(dash.at_exit)
        dash._thread.start()
        return dash

    # --- showing -----------------------------------------------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = self.widget._repr_mimebundle_()
        bundle["text/plain"] = self._text  # where widgets do not render: the latest snapshot
        return bundle

    def show(self) -> None:
        """Display the panel (its text snapshot beside it), under an id that :meth:`stop` updates."""
        self._publisher.publish(data=self._repr_mimebundle_(), metadata={},
                                transient={"display_id": self._display_id})

    def text(self) -> str:
        """The latest snapshot as text."""
        return self._text

    def _update(self) -> None:
        seen, stop = self._reader.read()
        now = time.time()
        footer = [f"last stop: {stop}"] if stop else []
        table, title = rows(seen, now), _title(self.world, now)
        with self._lock:
            if self._halt.is_set() and self.stopped is not None:
                return  # stopped meanwhile: its last drawing stands
            self._text = render_text(title, table, footer)
            self._table.value = render_html(title, table, footer)
            self.updates += 1

    def _run(self) -> None:
        while not self._halt.wait(self.interval):
            if self.session.world is not self.world:
                self.stop("this notebook left the world, or joined another", show=False)
                return
            try:
                self._update()
            except StoreConnectionError as exc:
                log.warning("nbdist dashboard: %s", exc)
                self.stop(f"lost contact with the rendezvous server: {exc}", show=False)
                return
            except Exception as exc:  # a bug of ours: say so in the panel and in the log, and stop
                log.exception("nbdist dashboard")
                self.stop(f"failed: {type(exc).__name__}: {exc}", show=False)
                return

    def _clicked(self, _button: Any) -> None:
        """The "stop all ranks" button (run by the kernel's main thread): what %dist_stop does."""
        try:
            n = self._stop_all()
        except NbdistError as exc:
            log.warning("nbdist dashboard: could not stop the ranks: %s", exc)
            self._status.value = f"<small>could not stop the ranks: {html.escape(str(exc))}</small>"
            return
        self._status.value = f"<small>stop #{n} sent to every rank of this world (%dist_stop)</small>"

    # --- stopping ----------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._halt.is_set()

    def at_exit(self) -> None:
        """Kernel exit: stop, telling the frontend nothing (its channels are closing)."""
        self.stop("the kernel exits", show=False, widgets=False)

    def stop(self, why: str = "stopped", show: bool = True, widgets: bool = True) -> None:
        """Stop updating: join the thread, close the connection, keep the last drawing; idempotent.

        ``show``: update the output's text snapshot too (on the kernel's main thread, outside a cell's
        capture); ``widgets``: say "stopped" in the panel and disable its button.
        """
        with self._lock:
            if self.stopped is not None:
                return
            self.stopped = why
            self._halt.set()
        atexit.unregister(self.at_exit)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT)
            if self._thread.is_alive():
                log.warning("nbdist dashboard: its thread did not end within %g s", JOIN_TIMEOUT)
        self._client.close()
        note = f"stopped: {why}"
        self._text = f"{self._text}\n{note}" if self._text else note
        if not widgets:
            return
        self._button.disabled = True
        self._status.value = f"<small>{html.escape(note)}</small>"
        if show:
            self._publisher.publish(data=self._repr_mimebundle_(), metadata={},
                                    transient={"display_id": self._display_id}, update=True)
