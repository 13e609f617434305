"""The side-by-side table of one %%collective cell, live or final: one renderer for both.

Pure: captures in (what each rank published, read by its fields: :class:`Captured`), HTML and text out. Each
rank's column lists its outputs in the order it produced them (see
:mod:`nbdist.cell.outputlog`). The ranks' sequences are aligned (:mod:`nbdist.view.align`):
an output that every rank produced at the same point, equal in every MIME
type, is shown once and marked identical; what lies between differs and is
shown per rank. Then come the ``Out`` row, errors, and, while the cell runs,
each rank's state.

Another rank's output is untrusted. Text is escaped; images are embedded only
as validated base64 PNG/JPEG; HTML is sanitised (:mod:`nbdist.view.sanitize`);
SVG, Markdown and LaTeX are shown as their source text.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import ranksets
from . import alike, grouped, sanitize
from .align import align
from .display import CELL_STYLE, DIFF_STYLE, PRE_STYLE, STDERR_STYLE, TABLE_STYLE, footer_html, text_html
from .grouped import labelled
from .numbers import template
from .shrink import DROPPED  # in a bundle: what was left out to fit the store, and why
from .tracebacks import readable

_B64 = re.compile(r"^[A-Za-z0-9+/=\s]+$")
_HTML_STYLE = "max-width:100%;overflow:auto"
_SOURCE_SHOWN = {"image/svg+xml": "SVG", "text/markdown": "Markdown", "text/latex": "LaTeX"}
FULL_TRACEBACK = "[full traceback, nbdist's frames included]"


class CapturedError(Protocol):
    """What a rank's body raised, as its column shows it (its capture's ``error``; None: not said)."""

    @property
    def ename(self) -> str: ...
    @property
    def evalue(self) -> str: ...
    @property
    def traceback(self) -> str | None: ...
    @property
    def short(self) -> str | None: ...
    @property
    def where(self) -> str | None: ...
    @property
    def consequence(self) -> bool | None: ...


class Captured(Protocol):
    """A rank's capture of a cell, as its column reads it: a :class:`nbdist.world.capture_record.Capture`, whose
    module the view does not import (the view never imports the world)."""

    @property
    def outputs(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def result(self) -> Mapping[str, str] | None: ...
    @property
    def error(self) -> CapturedError | None: ...
    @property
    def wall(self) -> float: ...
    @property
    def cancelled(self) -> str | None: ...


@dataclass
class Piece:
    """One output of one rank: what the text form shows, safe HTML, and its identity."""

    kind: str  # stdout, stderr, display, note, Out, error, stopped, state
    text: str
    html: str
    key: str  # equal keys: equal in every MIME type
    group: str = ""  # equal: alike enough to share a group's column (numbers aside, the same error); default the key

    def __post_init__(self) -> None:
        self.group = self.group or self.key

    @property
    def label(self) -> str:
        return "stopped by nbdist" if self.kind == "stopped" else self.kind


def _pre(text: str, style: str = "") -> str:
    return f'<pre style="{PRE_STYLE}{";" + style if style else ""}">{text_html(text)}</pre>'


def bundle_html(data: Mapping[str, Any]) -> str:
    """A rank's mime bundle as safe HTML: its richest form that is safe to show here."""
    notes = f"<div><small>{html.escape(data[DROPPED])}</small></div>" if data.get(DROPPED) else ""
    for mime in ("image/png", "image/jpeg"):
        payload = data.get(mime)
        if isinstance(payload, str) and _B64.match(payload):
            return f'<img src="data:{mime};base64,{payload.strip()}" style="max-width:100%">{notes}'
    if isinstance(data.get("text/html"), str):
        return f'<div style="{_HTML_STYLE}">{sanitize.clean_html(data["text/html"])}</div>{notes}'
    for mime, name in _SOURCE_SHOWN.items():
        if isinstance(data.get(mime), str):
            note = f"<small>{name}, shown as its source (nbdist does not render another rank's {name})</small>"
            return f"{note}{_pre(data[mime])}{notes}"
    return _pre(data.get("text/plain", "")) + notes


def bundle_text(data: Mapping[str, Any]) -> str:
    text = data.get("text/plain")
    if not isinstance(text, str):
        text = next((data[m] for m in _SOURCE_SHOWN if isinstance(data.get(m), str)), "")
    return f"{text}\n{data[DROPPED]}" if data.get(DROPPED) else text


def _bundle_piece(kind: str, data: Mapping[str, Any]) -> Piece:
    text = bundle_text(data)
    alike = f"{kind}\0{template(text)[0]}" if set(data) <= {"text/plain", DROPPED} else ""
    return Piece(kind, text, bundle_html(data), f"{kind}\0{json.dumps(data, sort_keys=True)}", alike)


def output_piece(output: Mapping[str, Any]) -> Piece:
    """A piece from one entry of a capture's ``outputs``."""
    kind = output.get("kind", "note")
    if kind == "display":
        return _bundle_piece("display", output.get("data") or {})
    text = str(output.get("text", ""))
    if kind == "stderr":
        return Piece(kind, text, _pre(text, STDERR_STYLE), f"stderr\0{text}", f"stderr\0{template(text)[0]}")
    if kind == "note":
        return Piece(kind, text, f"<small><i>{html.escape(text)}</i></small>", f"note\0{text}")
    return Piece("stdout", text, _pre(text), f"stdout\0{text}", f"stdout\0{template(text)[0]}")


def _details(summary: str, body: str) -> str:
    return f"<details><summary><small>{html.escape(summary)}</small></summary>{_pre(body)}</details>"


def error_pieces(cap: Captured, rank: int = 0) -> list[Piece]:
    """A rank's error, and why nbdist stopped it: the user's frames first, the full traceback one click away, a
    cell's frames in both as its lines (:func:`~nbdist.view.tracebacks.readable`: not one kernel's temporary file,
    which a group's one text would otherwise show). Alike (:mod:`nbdist.view.alike`) on ranks whose texts differ
    only in what names ``rank`` itself: the cell file's pid, nbdist's ``rank 3 (vm, pid 4242)``, its times."""
    error = cap.error
    cancelled = cap.cancelled or ""
    raw = "" if error is None or error.traceback is None else error.traceback
    full = readable(raw)
    if error is not None and cancelled and error.consequence:
        where = error.where or ""
        text = f"stopped{' in ' + where if where else ''}, because {cancelled}"
        body = f'{_pre(text)}{_details("full traceback", full)}'
        return [Piece("stopped", f"{text}\n{FULL_TRACEBACK}\n{full}", body, f"stopped\0{text}",
                      f"stopped\0{alike.key(text, rank)}")]
    pieces = []
    if error is not None:
        short = readable(error.short or raw)
        more = full != short  # nbdist's frames were hidden: the whole traceback, one click away
        body = _pre(short) + (_details("full traceback (with nbdist's frames)", full) if more else "")
        text = f"{short}\n{FULL_TRACEBACK}\n{full}" if more else short
        pieces.append(Piece("error", text, body, f"error\0{raw}", f"error\0{error.ename}\0{alike.key(short, rank)}"))
    if cancelled:
        pieces.append(Piece("stopped", cancelled, _pre(cancelled), f"stopped\0{cancelled}",
                            f"stopped\0{alike.key(cancelled, rank)}"))
    return pieces


def merged(pieces: Sequence[Piece], ranks: Sequence[int]) -> Piece:
    """One piece for alike pieces of ``ranks`` (an error, a stop): the first's, with what names its own rank
    written for them all (:func:`nbdist.view.alike.merge`)."""
    first = pieces[0]
    return Piece(first.kind, alike.merge([p.text for p in pieces], ranks), alike.merge([p.html for p in pieces], ranks),
                 first.key, first.group)


@dataclass
class Row:
    """One row: a piece every rank shares (``same``), or each rank's own pieces (``per_rank``)."""

    label: str
    same: Piece | None = None
    per_rank: list[list[Piece]] = field(default_factory=list)


def _differing(label: str | None, per_rank: list[list[Piece]]) -> Row | None:
    if not any(per_rank):
        return None
    kinds = dict.fromkeys(p.label for pieces in per_rank for p in pieces)  # in order of appearance
    return Row(label or " · ".join(kinds), per_rank=per_rank)


def _aligned_rows(columns: list[list[Piece]]) -> list[Row]:
    if len(columns) == 1:
        return [Row(p.label, per_rank=[[p]]) for p in columns[0]]
    rows = []
    for seg in align([[p.key for p in col] for col in columns]):
        if seg.same:
            piece = columns[0][seg.spans[0][0]]
            rows.append(Row(piece.label, same=piece))
        elif row := _differing(None, [col[a:b] for col, (a, b) in zip(columns, seg.spans, strict=True)]):
            rows.append(row)
    return rows


def _alike_row(per_rank: list[list[Piece]], ranks: Sequence[int]) -> Row | None:
    """The errors row: shared when every rank's errors and stops are alike (written once for all, with the ranks
    as a set); else each rank's own. Named after what it holds."""
    first = per_rank[0] if per_rank else []
    if len(per_rank) < 2 or not first or any([p.group for p in col] != [p.group for p in first] for col in per_rank):
        return _differing(None, per_rank)
    pieces = [merged([col[i] for col in per_rank], ranks) for i in range(len(first))]
    label = " · ".join(dict.fromkeys(p.label for p in pieces))
    if len(pieces) == 1:
        return Row(label, same=pieces[0])
    one = Piece(pieces[0].kind, "\n".join(p.text.rstrip("\n") for p in pieces), "".join(p.html for p in pieces),
                "\0".join(p.key for p in pieces), "\0".join(p.group for p in pieces))
    return Row(label, same=one)


def _fixed_row(label: str, per_rank: list[list[Piece]]) -> Row | None:
    """A row at a fixed place (Out, errors, state): shared when every rank has the same one piece."""
    if len(per_rank) > 1 and all(len(p) == 1 for p in per_rank) and len({p[0].key for p in per_rank}) == 1:
        return Row(label, same=per_rank[0][0])
    return _differing(label, per_rank)


@dataclass
class CellTable:
    """The table of one cell: headings per rank and rows in output order, drawn per rank or by groups of ranks."""

    title: str
    columns: list[str]
    rows: list[Row]
    footer: str = ""
    ranks: list[int] = field(default_factory=list)  # the rank of each column (all of them, or those --show names)
    hosts: list[str] = field(default_factory=list)
    walls: list[float | None] = field(default_factory=list)  # None while the cell runs
    world_size: int = 0
    by_groups: bool = False  # one column per group of alike ranks (:mod:`nbdist.view.grouped`)
    drawn: dict[Any, Any] = field(default_factory=dict, repr=False)  # grouped's work, kept for the second form

    def __post_init__(self) -> None:
        self.ranks = self.ranks or list(range(len(self.columns)))
        self.hosts = self.hosts or ["?"] * len(self.columns)
        self.walls = self.walls or [None] * len(self.columns)
        self.world_size = self.world_size or len(self.columns)

    def all_ranks(self) -> str:
        """Who a shared row is shared by: ``all 8 ranks``, or the ranks shown."""
        n = len(self.ranks)
        return f"all {n} ranks" if n == self.world_size else f"all {n} shown ranks"

    def _repr_html_(self) -> str:
        if self.by_groups:
            return grouped.to_html(self)
        n = len(self.columns)
        head = "".join(f'<th style="{CELL_STYLE}">{html.escape(c)}</th>' for c in self.columns)
        body = []
        for row in self.rows:
            if row.same is not None:
                note = f"<br><small>identical on {self.all_ranks()}</small>" if n > 1 else ""
                body.append(f'<tr><th style="{CELL_STYLE}">{html.escape(row.label)}{note}</th>'
                            f'<td colspan="{n}" style="{CELL_STYLE}">{row.same.html}</td></tr>')
                continue
            marked = n > 1 and row.label != "state"
            style = f"{CELL_STYLE};{DIFF_STYLE}" if marked else CELL_STYLE
            note = "<br><small>≠ differs between ranks</small>" if marked else ""
            tds = "".join(f'<td style="{style}">{"".join(p.html for p in pieces)}</td>' for pieces in row.per_rank)
            body.append(f'<tr><th style="{style}">{html.escape(row.label)}{note}</th>{tds}</tr>')
        foot = f"<div><small>{footer_html(self.footer)}</small></div>" if self.footer else ""
        return (f'<div class="nbdist"><div><b>{html.escape(self.title)}</b></div>'
                f'<table style="{TABLE_STYLE}"><thead><tr><th style="{CELL_STYLE}"></th>'
                f"{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{foot}</div>")

    def __repr__(self) -> str:
        """The text form, in the same order: runs of shared rows, then each rank's own rows under its heading."""
        if self.by_groups:
            return grouped.to_text(self)
        n = len(self.columns)
        lines = [self.title]
        for shared, group in grouped.runs(self.rows):
            if shared:
                lines.append(f"── {self.all_ranks()} (identical) ──" if n > 1 else f"── {self.columns[0]} ──")
                lines += [labelled(row.label, row.same.text) for row in group if row.same is not None]
            else:
                for r, column in enumerate(self.columns):
                    own = [p for row in group for p in row.per_rank[r]]
                    if not own:
                        continue
                    lines.append(f"── {column} ──")
                    for p in own:
                        marker = " (differs)" if n > 1 and p.kind != "state" else ""
                        lines.append(labelled(f"{p.label}{marker}", p.text))
        if self.footer:
            lines.append(self.footer)
        return "\n".join(lines)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self._repr_html_()}


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


_STATE_KIND = re.compile(r"^finished in [\d.]+ s, |^(failed) after [\d.]+ s| for \d+ s$| \(there for \d+ s\)$")


def state_kind(state: str) -> str:
    """What ranks in one state share: ``waiting for the others``, ``failed: ValueError``, ``running 34 s, waits in
    all_reduce #1 at cell line 3``, ``running 34 s, at cell line 5 (not moving)``: not how long each has been there."""
    return _STATE_KIND.sub(lambda m: m[1] or (" (not moving)" if m[0].startswith(" (there") else ""), state)


def cell_table(title: str, ranks: list[dict[str, Any]], captures: Sequence[Captured],
               states: list[str] | None = None, view: str | None = None,
               show: list[int] | None = None) -> CellTable:
    """The table of one %%collective cell; ``states`` (one line per rank) while it is still running.

    ``view``: "ranks" (a column per rank), "groups" (a column per group of alike
    ranks) or None (groups past 4 ranks, or when the columns would be too wide).
    ``show``: only these ranks' columns (every rank's when None).
    """
    world_size = len(ranks)
    shown = list(range(world_size)) if show is None else [r for r in show if r < world_size]
    if show is not None:
        title += f" · showing {ranksets.name(shown, world_size)} of {world_size}"
    infos, caps = [ranks[r] for r in shown], [captures[r] for r in shown]
    states = None if states is None else [states[r] for r in shown]
    columns = [f"rank {i} · {info.get('host', '?')}" + ("" if states else f" · {_duration(cap.wall)}")
               for i, info, cap in zip(shown, infos, caps, strict=True)]
    rows = _aligned_rows([[output_piece(o) for o in cap.outputs] for cap in caps])
    fixed = [
        ("Out", [[_bundle_piece("Out", cap.result)] if cap.result else [] for cap in caps]),
        ("error", [error_pieces(cap, rank) for rank, cap in zip(shown, caps, strict=True)]),
    ]
    if states:
        fixed.append(("state", [[Piece("state", s, _pre(s), f"state\0{s}", f"state\0{state_kind(s)}")]
                                for s in states]))
    for label, per_rank in fixed:
        row = _alike_row(per_rank, shown) if label == "error" else _fixed_row(label, per_rank)
        if row is not None:
            rows.append(row)
    table = CellTable(title, columns, rows, ranks=shown, hosts=[str(i.get("host", "?")) for i in infos],
                      walls=[None if states else c.wall for c in caps], world_size=world_size)
    table.by_groups = grouped.choose(view, table)
    return table
