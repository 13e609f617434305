"""Bus bandwidth as nccl-tests reports it, and ``%dist_bench``'s flags, table and plot (pure: rows in, text out).

nccl-tests' convention (doc/PERFORMANCE.md): ``algbw = S / t`` and ``busbw = algbw * factor``
with the factors of :data:`FACTORS`, ``n`` ranks. ``S`` is each rank's buffer for all_reduce,
broadcast and send_recv, and the whole gathered or scattered buffer for all_gather (its output),
reduce_scatter (its input) and all_to_all; GB are 1e9 bytes.
"""

from __future__ import annotations

import base64
import html
import io
import re
from typing import Any

from ..errors import ConfigError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
# op -> (k, ring): busbw = algbw * k * (n - 1) / n when ring, else algbw * k.
FACTORS: dict[str, tuple[int, bool]] = {
    "all_reduce": (2, True),
    "all_gather": (1, True),
    "reduce_scatter": (1, True),
    "all_to_all": (1, True),
    "broadcast": (1, False),
    "send_recv": (1, False),
}
# Ops whose S is split into n equal chunks, one per rank: their element count is a multiple of n.
CHUNKED = ("all_gather", "reduce_scatter", "all_to_all")
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_SIZE = 1 << 34  # 16G: a larger buffer per rank is a typo
_SIZE = re.compile(r"(\d+)([KMG]?)(?:I?B)?", re.IGNORECASE)


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``op`` for ``world_size`` ranks."""
    k, ring = FACTORS[op]
    return k * (world_size - 1) / world_size if ring else float(k)


def formula(op: str) -> str:
    """The factor as the README's table writes it."""
    k, ring = FACTORS[op]
    return (f"{k}(n-1)/n" if k != 1 else "(n-1)/n") if ring else str(k)


def parse_size(text: str) -> int:
    """Bytes in ``8``, ``64K``, ``1M``, ``2G`` (units of 1024, as nccl-tests takes them; ``KB``/``KiB`` too)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"--sizes: {text.strip()!r} is not a size (examples: 8, 64K, 1M, 2G)")
    size = int(match.group(1)) * UNITS[match.group(2).upper()]
    if not 1 <= size <= MAX_SIZE:
        raise ConfigError(f"--sizes: {text.strip()!r} must be between 1 byte and {format_size(MAX_SIZE)}")
    return size


def parse_sizes(text: str) -> tuple[int, ...]:
    """``MIN:MAX`` (doubling from MIN while at most MAX), a single size, or a comma list of either; sorted."""
    sizes: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.partition(":")
        first = parse_size(low)
        last = parse_size(high) if sep else first
        if last < first:
            raise ConfigError(f"--sizes: {part.strip()!r} runs backwards (MIN:MAX, MIN <= MAX)")
        size = first
        while size <= last:
            sizes.add(size)
            size *= 2
    return tuple(sorted(sizes))


def parse_ops(text: str) -> tuple[str, ...]:
    """A comma list of :data:`OPS` (or ``all``), in the order given, without repeats."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return OPS
    unknown = [name for name in names if name not in OPS]
    if unknown or not names:
        raise ConfigError(f"--ops: unknown op {', '.join(map(repr, unknown)) or '(none given)'}; "
                        f"choose from {','.join(OPS)} (or all)")
    return tuple(dict.fromkeys(names))


def element_count(op: str, size: int, itemsize: int, world_size: int) -> int:
    """Elements of S for ``op``: ``size`` bytes rounded down to whole elements (and whole chunks), at least one each."""
    count = max(1, size // itemsize)
    if op in CHUNKED:
        count = max(world_size, count - count % world_size)
    return count


def row(op: str, count: int, itemsize: int, dtype: str, rank_seconds: list[float]) -> dict[str, Any]:
    """One result: the slowest rank's median time, and the bandwidths nccl-tests would report for it."""
    n = len(rank_seconds)
    seconds = max(rank_seconds)
    size = count * itemsize
    algbw = size / seconds / 1e9
    return {
        "op": op, "size": size, "count": count, "dtype": dtype, "ranks": n,
        "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(op, n),
        "rank_time_us": [s * 1e6 for s in rank_seconds],
    }


def format_size(size: int) -> str:
    """Bytes as the flags write them: ``8``, ``1K``, ``64M``."""
    for unit in ("G", "M", "K"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return str(size)


COLUMNS = ("op", "size", "count", "time (µs)", "algbw (GB/s)", "busbw (GB/s)")


def _cells(r: dict[str, Any]) -> list[str]:
    return [r["op"], format_size(r["size"]), str(r["count"]), f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.3f}",
            f"{r['busbw_gbps']:.3f}"]


class BenchResults(list[dict[str, Any]]):
    """``%dist_bench``'s results: a list of dicts, one per op and size; its repr is one line, not the list."""

    def __repr__(self) -> str:
        ops = len({r["op"] for r in self})
        sizes = max((sum(r["op"] == op for r in self) for op in {r["op"] for r in self}), default=0)
        ranks = f" on {self[0]['ranks']} rank(s)" if self else ""
        return f"<%dist_bench results: {len(self)} rows, {ops} op(s) x {sizes} size(s){ranks}; a list of dicts>"


class BenchTable:
    """The results as one table: HTML, and text for frontends without HTML (and ``nbdist bench``)."""

    def __init__(self, rows: list[dict[str, Any]], title: str, footer: str = "") -> None:
        self.rows, self.title, self.footer = list(rows), title, footer

    def __repr__(self) -> str:
        cells = [list(COLUMNS), *(_cells(r) for r in self.rows)]
        widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
        lines = [self.title]
        for c in cells:
            lines.append("  ".join(c[0].ljust(widths[0]) if i == 0 else c[i].rjust(widths[i])
                                   for i in range(len(COLUMNS))).rstrip())
        if not self.rows:
            lines.append("(no size was measured)")
        if self.footer:
            lines.append(self.footer)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        style = "padding:2px 8px;border:1px solid rgba(128,128,128,0.35)"
        head = "".join(f'<th style="{style}">{html.escape(c)}</th>' for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f'<td style="{style};text-align:{"left" if i == 0 else "right"}">{html.escape(c)}</td>'
                             for i, c in enumerate(_cells(r))) + "</tr>"
            for r in self.rows)
        empty = "<div><small>(no size was measured)</small></div>" if not self.rows else ""
        foot = f"<div><small>{html.escape(self.footer)}</small></div>" if self.footer else ""
        return (f'<div class="nbdist"><div><b>{html.escape(self.title)}</b></div>'
                f'<table style="border-collapse:collapse"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
                f"</table>{empty}{foot}</div>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self._repr_html_()}


class BenchPlot:
    """A PNG picture, shown as such (its text form says what it is)."""

    def __init__(self, png: bytes, what: str) -> None:
        self.png, self.what = png, what

    def __repr__(self) -> str:
        return f"<{self.what}: a PNG image>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"image/png": base64.b64encode(self.png).decode("ascii"), "text/plain": repr(self)}


def plot_png(rows: list[dict[str, Any]], title: str) -> bytes | None:
    """A log-log plot of busbw against size, one line per op, as PNG bytes; None without matplotlib.

    It uses matplotlib's object-oriented API (a Figure on an Agg canvas), never pyplot, so the
    notebook's own backend and figures are left alone. Zero bandwidths (one rank) are left out.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        return None
    fig = Figure(figsize=(7.5, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sizes: set[int] = set()
    for op in dict.fromkeys(r["op"] for r in rows):
        points = [(r["size"], r["busbw_gbps"]) for r in rows if r["op"] == op and r["busbw_gbps"] > 0]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=op)
            sizes.update(p[0] for p in points)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if sizes:
        ticks = sorted(sizes)
        step = max(1, len(ticks) // 10)
        ax.xaxis.set_major_locator(FixedLocator(ticks[::step]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([format_size(s) for s in ticks[::step]])
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no bus bandwidth to plot", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("size S (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
