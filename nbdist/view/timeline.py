"""The picture of a traced cell: one lane per rank, a bar per collective from entry to exit.

Each bar is drawn in its op's colour (Okabe–Ito, as :mod:`nbdist.view.pictures`);
its first part, from this rank's entry until the last rank arrived, is
hatched: the time this rank waited for the others. The last arrival of each
late collective is labelled ("rank 1 +2.1 s"). Drawn with matplotlib's
object-oriented API (never pyplot, so the notebook's own figures are left
alone) into a PNG; the text form lists the late arrivals in words, for
frontends that show no images.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from . import trace
from .pictures import PALETTE

MAX_BARS = 2000  # bars drawn; a longer trace is drawn in part (the data keeps every call)


class Timeline:
    """A traced cell's timeline as a notebook output (PNG, and the late arrivals as text)."""

    def __init__(self, calls: list[dict[str, Any]], world_size: int, title: str = "") -> None:
        self.calls, self.world_size, self.title = calls, world_size, title
        self.rows = trace.lateness(calls)
        self.lines = trace.headline(self.rows, world_size)

    def text(self) -> str:
        counted = len({(c["group"], c["seq"]) for c in self.calls if c["seq"] is not None})
        head = f"{self.title}: " if self.title else ""
        summary = f"{head}timeline of {counted} collective(s) on {self.world_size} rank(s)"
        return "\n".join([summary, *(f"  {line}" for line in self.lines or ["no rank was late"])])

    def png(self) -> bytes | None:
        """The picture, or None without matplotlib."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
            from matplotlib.patches import Patch
        except ImportError:
            return None
        calls = self.calls[:MAX_BARS]
        ops = sorted({c["op"] for c in calls})
        colour = {op: PALETTE[i % len(PALETTE)] for i, op in enumerate(ops)}
        arrived = {(r["group"], r["seq"]): r["first"] + r["late"] for r in self.rows}
        fig = Figure(figsize=(9, 1.0 + 0.45 * self.world_size), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        end = max((c["leave"] for c in calls), default=0.0) or 1e-6
        unit, scale = ("s", 1.0) if end >= 1 else ("ms", 1e3)
        for c in calls:
            y, left, right = c["rank"], c["enter"] * scale, c["leave"] * scale
            last = arrived.get((c["group"], c["seq"]), c["enter"]) * scale
            ax.barh(y, max(right - left, end * scale / 800), left=left, height=0.6, color=colour[c["op"]],
                    edgecolor="black", linewidth=0.3)
            if last > left:
                ax.barh(y, min(last, right) - left, left=left, height=0.6, color="white", alpha=0.55,
                        hatch="///", edgecolor="black", linewidth=0.3)
        for r in trace.notable(self.rows):
            ax.annotate(f"rank {r['last']} {trace.seconds_text(r['late'])} late",
                        ((r["first"] + r["late"]) * scale, r["last"]), xytext=(-3, 0), textcoords="offset points",
                        fontsize=7, ha="right", va="center",
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
        ax.set_yticks(range(self.world_size), [f"rank {i}" for i in range(self.world_size)])
        ax.set_ylim(self.world_size - 0.4, -0.6)
        ax.set_xlabel(f"{unit} since the cell's start barrier (each rank's own clock)")
        if ops:
            ax.legend(handles=[Patch(facecolor=colour[op], edgecolor="black", label=op) for op in ops],
                      loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        ax.set_title(self.text().splitlines()[0] + " (hatched: waiting for the last rank)", fontsize=8)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="png")
        return out.getvalue()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/plain": self.text()}
        png = self.png()
        lines = "".join(f"<div>{html.escape(line)}</div>" for line in self.lines)
        if png is not None:
            data = base64.b64encode(png).decode()
            bundle["image/png"] = data
            bundle["text/html"] = (f'<div class="nbdist-timeline"><img src="data:image/png;base64,{data}" '
                                   f'alt="{html.escape(self.text())}"/><div><small>{lines}</small></div></div>')
        return bundle
