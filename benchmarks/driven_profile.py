"""Where a driven ``%%collective``'s time goes, across its ranks: a timeline of one trivial cell (issue 50, item 1).

One kernel runs ``%load_ext nbdist`` and ``%dist_init --spawn N`` (default 2); a first ``%%collective`` puts
timing wrappers, on every rank, around the functions a cell passes through (IPython's cell events as nbdist
handles them, the session's ``collective``, the driver's publishing, the follower's wait for the next message, the
start meeting, the body, the cell's end, the table). Then ``--runs`` trivial cells (``x = 1``) are timed from the
client, as ``driven_cells.py`` times them, and each wrapper's start and end (``time.time()``: one clock for every
process of this machine) are read back. Per cell, the segments of the driver's path from the client's request to
the kernel's reply, and the follower's, are the differences of those stamps; each row is their median over the
cells. A plain cell ``x = 1`` in the same driving kernel, timed beside them, is what a cell costs without nbdist's
step (IPython and the kernel's messages).

Run from the repository root::

    .venv/bin/python benchmarks/driven_profile.py
    .venv/bin/python benchmarks/driven_profile.py --ranks 4 --runs 60

Writes ``docs/figures/driven_profile.json`` and ``.md``. Wrappers cost a few µs a call; the client's figure
with them is printed beside the one without, from the same run, to show it.
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import begin, figure, load_note, record  # noqa: E402

Stamps = list[tuple[str, float, float]]  # (label, started, ended), in time.time()
Cell = tuple[float, float, float]  # a timed cell: sent, idle, the next cell sent
WRAPPED = {  # label: (module, owner or None, function)
    "before_cell": ("nbdist.cell.kernelturn", "KernelTurn", "before_cell"),
    "after_cell": ("nbdist.cell.kernelturn", "KernelTurn", "after_cell"),
    "collective": ("nbdist.session", "Session", "collective"),
    "publish": ("nbdist.drive.follow", "Drive", "publish"),
    "next": ("nbdist.drive.follow", "Follower", "next"),
    "meet": ("nbdist.world.gather", None, "meet"),
    "run": ("nbdist.cell.cells", None, "run"),
    "body": ("nbdist.cell.capture", None, "run_cell"),
    "show": ("nbdist.cell.outcome_view", None, "show"),
}
WRAP = """%%collective
import functools as _nbp_f, importlib as _nbp_i, time as _nbp_t
_nbp_stamps = []
def _nbp_wrap(label, module, owner, name):
    where = _nbp_i.import_module(module)
    where = getattr(where, owner) if owner else where
    original = getattr(where, name)
    @_nbp_f.wraps(original)
    def timed(*args, **kwargs):
        started = _nbp_t.time()
        try:
            return original(*args, **kwargs)
        finally:
            _nbp_stamps.append((label, started, _nbp_t.time()))
    setattr(where, name, timed)
for _nbp_label, (_nbp_m, _nbp_o, _nbp_n) in {wrapped!r}.items():
    _nbp_wrap(_nbp_label, _nbp_m, _nbp_o, _nbp_n)
"""
# The driver's path, in order: (row, from (label, start|end), to (label, start|end)); "send"/"idle": the client's.
DRIVER = [
    ("the kernel takes the request, IPython starts the cell", ("send", 0), ("before_cell", 0)),
    ("nbdist's pre_run_cell (the turn's step taken)", ("before_cell", 0), ("before_cell", 1)),
    ("the magic (its flags) until the session's collective", ("before_cell", 1), ("collective", 0)),
    ("the generation and the turn, until publishing", ("collective", 0), ("publish", 0)),
    ("publishing the cell to the followers (sign, number, write)", ("publish", 0), ("publish", 1)),
    ("until the start meeting opens (the followers arrive)", ("publish", 1), ("meet", 1)),
    ("until the body starts", ("meet", 1), ("body", 0)),
    ("the body (x = 1, captured)", ("body", 0), ("body", 1)),
    ("the cell's end (its record, the end meeting, the records read)", ("body", 1), ("run", 1)),
    ("until the table is shown (none for x = 1)", ("run", 1), ("show", 1)),
    ("until nbdist's post_run_cell ends", ("show", 1), ("after_cell", 1)),
    ("the kernel's reply, until the client sees it idle", ("after_cell", 1), ("idle", 0)),
]
FOLLOWER = [
    ("publishing ends -> the follower's wait returns (woken, read, verified)", ("publish", 1), ("next", 1)),
    ("-> its session's collective starts", ("next", 1), ("collective", 0)),
    ("-> it arrives at the start meeting", ("collective", 0), ("meet", 0)),
    ("its start meeting (waiting for the driver's arrival)", ("meet", 0), ("meet", 1)),
    ("its collective, whole", ("collective", 0), ("collective", 1)),
]


def stamps_of(text: str, ranks: int) -> list[Stamps]:
    """Every rank's stamps, from a ``--view ranks`` table printing ``repr(_nbp_stamps)`` on each rank."""
    found = [ast.literal_eval(m) for m in re.findall(r"\[\('.*?\)\]", text, flags=re.S)]
    if len(found) != ranks:
        raise SystemExit(f"read {len(found)} ranks' stamps, not {ranks}:\n{text[:2000]}")
    return found


BY_END = {"next"}  # a follower's wait for the cell starts before the cell is sent: found by when it ended


def at(stamps: Stamps, label: str, lo: float, hi: float, edge: int) -> float | None:
    """The first ``label`` that started (ended, for :data:`BY_END`) in [lo, hi): its start (edge 0) or end (1)."""
    which = 2 if label in BY_END else 1
    hits = sorted((s for s in stamps if s[0] == label and lo <= s[which] < hi), key=lambda s: s[which])
    return hits[0][1 + edge] if hits else None


def point(p: tuple[str, int], cell: Cell, stamps: Stamps, extra: dict[str, Stamps]) -> float | None:
    """A stamp of one cell (``cell``: sent, idle, the next one sent): the client's, or a wrapped call's edge."""
    label, edge = p
    sent, idle, after = cell
    if label == "send":
        return sent
    if label == "idle":
        return idle
    return at(extra.get(label, stamps), label, sent, after, edge)


def segments(rows: list[tuple[str, tuple[str, int], tuple[str, int]]], stamps: Stamps,
             cells: list[Cell], extra: dict[str, Stamps]) -> dict[str, list[float]]:
    """Each row's ms per cell; ``extra``: another rank's stamps, by label (the driver's publishing)."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for cell in cells:
        for name, a, b in rows:
            x, y = point(a, cell, stamps, extra), point(b, cell, stamps, extra)
            if x is not None and y is not None:
                out[name].append((y - x) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    from nbdist.drive import kernels

    began = begin()
    print(load_note("before"))
    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        r = k.execute(f"%dist_init --spawn {args.ranks}", timeout=600)
        assert r.status == "ok", r.text()
        for _ in range(5):
            assert k.execute("%%collective\nx = 1", timeout=60).status == "ok"
        bare = _timed(k, "%%collective\nx = 1", args.runs)
        plain = _timed(k, "x = 1", args.runs)
        r = k.execute(WRAP.format(wrapped=WRAPPED), timeout=60)
        assert r.status == "ok", r.text()
        for _ in range(3):
            assert k.execute("%%collective\nx = 1", timeout=60).status == "ok"
        assert k.execute("%%collective\n_nbp_stamps.clear()", timeout=60).status == "ok"
        sends = []
        for _ in range(args.runs):
            sent = time.time()
            assert k.execute("%%collective\nx = 1", timeout=60).status == "ok"
            sends.append((sent, time.time()))
            time.sleep(0.02)  # the followers back in their wait
        text = k.execute("%%collective --view ranks\nprint(repr(_nbp_stamps))", timeout=120).text()
    finally:
        k.shutdown()
    every = stamps_of(text, args.ranks)
    cells = [(s, i, n) for (s, i), (n, _) in zip(sends, [*sends[1:], (float("inf"), 0.0)], strict=True)]
    wall = [(i - s) * 1000 for s, i in sends]
    driver = segments(DRIVER, every[0], cells, {})
    follower = segments(FOLLOWER, every[1], cells, {"publish": every[0]})
    rows = [figure(f"plain cell `x = 1` in the driving kernel, {args.ranks} ranks", [t * 1000 for t in plain], "ms"),
            figure(f"driven `%%collective` `x = 1`, {args.ranks} ranks, no wrappers", [t * 1000 for t in bare], "ms"),
            figure(f"the same with the wrappers (the timeline's cells), {args.ranks} ranks", wall, "ms")]
    print(f"plain cell x = 1: {statistics.median(plain) * 1000:.2f} ms; driven %%collective x = 1: "
          f"{statistics.median(bare) * 1000:.2f} ms without wrappers, {statistics.median(wall):.2f} ms with")
    for who, found in (("driver (rank 0)", driver), ("follower (rank 1)", follower)):
        print(f"-- {who} --")
        for name, values in found.items():
            if values:
                print(f"  {name:<72} {statistics.median(values):7.3f} ms  (n={len(values)})")
                rows.append(figure(f"{who}: {name}", values, "ms", decimals=3))
    total = sum(statistics.median(v) for v in driver.values() if v)
    print(f"driver's segments, medians summed: {total:.2f} ms (the client's wall with wrappers: "
          f"{statistics.median(wall):.2f} ms)")
    print(load_note("after"))
    record("driven_profile", f"Where a driven `%%collective` `x = 1` spends its time, {args.ranks} ranks (a timeline "
           "from wrappers on every rank; medians over the cells)", rows, began,
           notes=["Segments are differences of `time.time()` stamps taken at the start and end of wrapped "
                  "functions on each rank's process (one clock on this machine); each row is the median over "
                  f"{args.runs} cells, so the rows need not add up to the wall time exactly."])


def _timed(k: Any, code: str, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        assert k.execute(code, timeout=60).status == "ok"
        out.append(time.perf_counter() - started)
        time.sleep(0.02)
    return out


if __name__ == "__main__":
    main()
