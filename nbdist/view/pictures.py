"""A small picture of a tensor: its values in a grid, each cell coloured by the rank that owns it.

Static HTML (a div holding a table, inline styles only) that comes through :func:`nbdist.view.sanitize.clean_html`
unchanged, so another rank's picture looks the same in this rank's side-by-side table; and a text/plain form
that shows the owning ranks too, for readers without colour. torch is never imported: tensors are read
through ``.detach``/``.cpu``/``.tolist``/``.shape``/``.dtype``.
"""

from __future__ import annotations

import html
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from IPython.display import display

MAX_VALUES = 256
MAX_COLUMNS = 32
SUMMARY_VALUES = 8
DEFAULT_WORLD_SIZE = 8  # when no world is joined and none is given: values 0..799 are coloured
# Okabe-Ito without its black (unreadable on a dark theme), then a grey: eight ranks, cycling beyond.
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")
NEUTRAL = "rgba(128, 128, 128, 0.12)"  # written as nh3 writes it, so that sanitising changes nothing
BORDER = "1px solid rgba(128, 128, 128, 0.5)"
_CELL = f"border:{BORDER};padding:1px 6px;text-align:right;min-width:1.5em;white-space:pre"
_CHIP = f"border:{BORDER};padding:0 4px;white-space:pre"  # a legend entry: styled like the cells it names


def _luminance(colour: str) -> float:
    """WCAG relative luminance of a #RRGGBB colour."""
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_colour(background: str) -> str:
    """Black or white, whichever contrasts more with ``background`` (#RRGGBB)."""
    light = _luminance(background)
    return "#000000" if (light + 0.05) / 0.05 >= 1.05 / (light + 0.05) else "#FFFFFF"


@dataclass(frozen=True, repr=False)
class Picture:
    """A drawn tensor: ``text`` (text/plain) and ``html`` (text/html), both deterministic."""

    text: str
    html: str

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        bundle = {"text/plain": self.text, "text/html": self.html}
        return {k: v for k, v in bundle.items() if (not include or k in include) and not (exclude and k in exclude)}

    def __repr__(self) -> str:
        return self.text


def show(tensor: Any, label: str | None = None, owner: Any = None, *, world_size: int | None = None) -> None:
    """Display :func:`picture` of ``tensor``; returns None, so a last-line ``show(x)`` draws once."""
    display(picture(tensor, label, owner, world_size=world_size))


def picture(tensor: Any, label: str | None = None, owner: Any = None, *, world_size: int | None = None) -> Picture:
    """``tensor`` drawn as a grid coloured by owning rank (0-D, 1-D, 2-D), or summarised (larger, 3-D+, complex).

    ``owner``: None (value ``rank * 100 + i`` belongs to ``rank``), a Mapping value -> rank, a callable
    value -> rank or None, an int rank, per-element ranks of the tensor's shape, or False (nothing coloured).
    """
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"world_size must be a positive int, not {world_size!r}")
    label = None if label is None else str(label)
    shape, dtype, flat = _load(tensor, limit=MAX_VALUES + 1)
    size = math.prod(shape)
    head = f"shape {shape} · {dtype}"
    why = _why_summarised(shape, dtype, size)
    if why is not None:
        _owner_kind(owner)  # a bad owner is an error even where nothing is coloured
        first = " ".join(_format(v) for v in flat[:SUMMARY_VALUES])
        more = f"first {SUMMARY_VALUES}: {first} …" if size > SUMMARY_VALUES else f"values: {first}"
        lines = [f"{head} · {size} value{'s' * (size != 1)}, not drawn ({why})"] + [more] * (size > 0)
        text = "\n".join([label, *lines] if label is not None else lines)
        body = "".join(f"<div>{_escape(line)}</div>" for line in lines)
        return Picture(text, f'<div style="line-height:1.3">{_title(label)}{body}</div>')
    ranks = _owners(owner, flat, shape, world_size)
    ncols = shape[-1] if shape else 1
    rows = [list(range(i, i + ncols)) for i in range(0, size, ncols)]
    return Picture(_text(label, head, flat, ranks, rows), _html(label, head, flat, ranks, rows))


def _load(data: Any, limit: int | None = None) -> tuple[tuple[int, ...], str, list[Any]]:
    """(shape, dtype name, values in row-major order: all of them, or the first ``limit`` past the limit)."""
    if hasattr(data, "tolist") and hasattr(data, "shape") and hasattr(data, "dtype"):
        shape = tuple(int(n) for n in data.shape)
        flat = (data.detach() if hasattr(data, "detach") else data).reshape(-1)
        if limit is not None and math.prod(shape) > limit:
            flat = flat[:limit]  # before .cpu(): a large device tensor is summarised without copying it all
        flat = flat.cpu() if hasattr(flat, "cpu") else flat
        return shape, str(data.dtype).removeprefix("torch."), flat.tolist()
    dims: list[int] = []
    probe = data
    while isinstance(probe, list | tuple):
        dims.append(len(probe))
        probe = probe[0] if probe else None
    flat = _flatten(data, tuple(dims))
    return tuple(dims), _python_dtype(flat), flat


def _flatten(data: Any, shape: tuple[int, ...]) -> list[Any]:
    if isinstance(data, list | tuple) != bool(shape) or (shape and len(data) != shape[0]):
        raise ValueError("a ragged nested list has no shape; pass a rectangular one")
    return [v for item in data for v in _flatten(item, shape[1:])] if shape else [data]


def _python_dtype(values: list[Any]) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "int" if all(isinstance(v, int) for v in values) else "float"
    return "object"


def _why_summarised(shape: tuple[int, ...], dtype: str, size: int) -> str | None:
    if size == 0:
        return "empty"
    if not (dtype == "bool" or dtype.startswith(("int", "uint", "float", "bfloat"))):
        return f"{dtype} values are not drawn"
    if len(shape) > 2:
        return f"{len(shape)}-D"
    if size > MAX_VALUES:
        return f"more than {MAX_VALUES} values"
    if shape and shape[-1] > MAX_COLUMNS:
        return f"more than {MAX_COLUMNS} columns"
    return None


def _format(v: Any) -> str:
    if isinstance(v, float):
        return "0" if v == 0 else format(v, ".4g")  # also -0.0, which reads as noise in a picture
    return str(v)


def _owner_kind(owner: Any) -> str:
    if owner is False:
        return "none"
    if owner is None:
        return "convention"
    if isinstance(owner, bool):
        raise ValueError("owner=True means nothing: pass None (the rank*100+i convention), a rank, or False")
    if isinstance(owner, numbers.Integral):
        if owner < 0:
            raise ValueError(f"owner must be a rank >= 0, not {owner}")
        return "rank"
    if isinstance(owner, Mapping):
        return "mapping"
    if isinstance(owner, list | tuple) or hasattr(owner, "tolist"):
        return "elements"
    if callable(owner):
        return "callable"
    raise ValueError(
        f"owner must be None, False, a rank, a Mapping, a callable or per-element ranks, not {type(owner).__name__}"
    )


def _owners(owner: Any, values: list[Any], shape: tuple[int, ...], world_size: int | None) -> list[int | None]:
    kind = _owner_kind(owner)
    if kind == "none":
        return [None] * len(values)
    if kind == "convention":
        top = 100 * (world_size or _joined_world_size() or DEFAULT_WORLD_SIZE)
        return [_conventional(v, top) for v in values]
    if kind == "rank":
        return [int(owner)] * len(values)
    if kind == "elements":
        owner_shape, _, ranks = _load(owner)
        if owner_shape != shape:
            raise ValueError(f"owner has shape {owner_shape} but the tensor has shape {shape}: they must match")
    else:
        get: Callable[[Any], Any] = owner.get if kind == "mapping" else owner
        ranks = [get(v) for v in values]
    return [_rank(r) for r in ranks]


def _conventional(v: Any, top: int) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
        return None
    return int(v) // 100 if 0 <= v < top else None


def _rank(r: Any) -> int | None:
    if r is None:
        return None
    if isinstance(r, bool) or not isinstance(r, numbers.Integral):
        raise ValueError(f"an owner rank must be an int or None, not {r!r}")
    rank = int(r)
    return rank if rank >= 0 else None  # negative: a mask's "nobody"


def _joined_world_size() -> int | None:
    """The joined world's size, looked up only if nbdist's magics are already loaded (no import here)."""
    magics = sys.modules.get("nbdist.magics")
    if magics is None:
        return None
    from IPython import get_ipython

    registry = getattr(getattr(get_ipython(), "magics_manager", None), "registry", {})
    world = getattr(getattr(registry.get(magics.DistMagics.__name__), "session", None), "world", None)
    size = getattr(world, "world_size", None)
    return size if isinstance(size, int) and size > 0 else None


def _text(label: str | None, head: str, flat: list[Any], ranks: list[int | None], rows: list[list[int]]) -> str:
    values = _aligned([[_format(flat[i]) for i in row] for row in rows])
    owners = _aligned([["-" if ranks[i] is None else str(ranks[i]) for i in row] for row in rows], " ")
    width = max(len("values"), len(values[0]))
    lines = [f"{'values'.ljust(width)}   ranks"]
    lines += [f"{v.ljust(width)}   {o}" for v, o in zip(values, owners, strict=True)]
    return "\n".join(([label] if label is not None else []) + [head] + lines)


def _aligned(cells: list[list[str]], gap: str = "  ") -> list[str]:
    widths = [max(len(row[j]) for row in cells) for j in range(len(cells[0]))]
    return [gap.join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in cells]


def _html(label: str | None, head: str, flat: list[Any], ranks: list[int | None], rows: list[list[int]]) -> str:
    table = "".join("<tr>" + "".join(_cell(_format(flat[i]), ranks[i]) for i in row) + "</tr>" for row in rows)
    present = sorted({r for r in ranks if r is not None})
    legend = " ".join(_swatch(r, f"rank {r}", "span", _CHIP) for r in present) or "not coloured by rank"
    return (
        f'<div style="line-height:1.3">{_title(label, head)}'
        f'<table style="border-collapse:collapse;border-spacing:0;font-family:monospace"><tbody>{table}</tbody></table>'
        f'<div style="font-size:85%;padding-top:3px">{legend}</div></div>'
    )


def _cell(text: str, rank: int | None) -> str:
    if rank is None:
        return f'<td style="background-color:{NEUTRAL};{_CELL}">{_escape(text)}</td>'
    return _swatch(rank, text, "td", _CELL)


def _swatch(rank: int, text: str, tag: str, style: str) -> str:
    # Both colours explicit: a coloured cell must read the same on a light and on a dark theme.
    background = PALETTE[rank % len(PALETTE)]
    colours = f"background-color:{background};color:{text_colour(background)}"
    return f'<{tag} title="rank {rank}" style="{colours};{style}">{_escape(text)}</{tag}>'


def _title(label: str | None, head: str | None = None) -> str:
    bold = f'<span style="font-weight:bold">{_escape(label)}</span>' if label is not None else ""
    small = f'<span style="font-size:85%">{_escape(head)}</span>' if head is not None else ""
    return f"<div>{bold}{' ' if bold and small else ''}{small}</div>" if bold or small else ""


def _escape(text: str) -> str:
    # Text only, never attributes: quotes need no escaping there, and nh3 writes them bare, so this stays unchanged.
    return html.escape(str(text), quote=False)
