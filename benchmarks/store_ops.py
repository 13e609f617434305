"""How many store operations, and how many bytes, each rank spends on a trivial ``%%collective`` cell.

The goal (issue 34): a constant number of store operations per rank per cell, whatever the world size; the
driving notebook reads every rank's output once, and nobody reads every other rank's keys in a loop. This
script measures it; it changes nothing in nbdist's protocol.

For each world size N (``--world-sizes``, default 2 4 8 16) it starts one kernel that runs ``%load_ext
nbdist`` and ``%dist_init --spawn N`` (rank 0 on 127.0.0.1, N-1 local worker kernels that follow it), as
``driven_cells.py`` does, and drives from it, on every rank:

  1. ``--warmup`` trivial ``%%collective`` cells ``x = 1``, not counted;
  2. the cells phase: a ``%%collective`` cell that takes a snapshot of this process's store counts
     (``nbdist.world.store.COUNTS``, which every ``StoreClient`` of the process adds to) and the time, K
     (``--cells``, default 50) trivial ``%%collective`` cells ``x = 1``, then a ``%%collective`` cell that
     takes the second snapshot and writes the difference to a file (every rank is on this machine). The
     two recording cells are trivial cells too, and the snapshots are taken inside their bodies, so
     between them lie exactly K + 1 cells' worth of store traffic: per cell = difference / (K + 1);
  3. the idle phase: a snapshot cell, ``--idle`` seconds (default 5) with no cell at all, and the second
     snapshot cell: one cell's worth of traffic plus what the threads that run between cells (heartbeat,
     a follower's look at its driver, the live table's watcher) spend in that time.

Per rank the two phases give two equations, ``cells = (K+1)·c + r·T_cells`` and ``idle = c + r·T_idle``,
solved for ``c`` (per cell, net of the background) and ``r`` (background per second). The headline figure
is the raw one (difference / (K + 1), background included: that is what a rank spends while cells run
back to back); the net one and the rate are printed beside it.

Ops count every ``StoreClient`` call and wait (see ``StoreCounts`` in ``nbdist/world/store.py`` for what is
counted and how bytes are approximated: keys and values, not torch's framing; the pulse process's own
beats are not counted). It prints, per N, rank 0 (the driving notebook) and the workers (median and max
over them) in ops per cell and bytes (sent + received) per cell, the top operation kinds, then one table
for every N and which figures grow with N. It writes ``docs/figures/store_ops.json`` and ``.md``.

``--waiting S`` measures instead what a rank spends while it *waits* (the cells phase and the figures are
left out): per N, two kinds of cell whose rank 0 sleeps ``S`` seconds in its body while the others wait,

  - "end": ``if RANK == 0: time.sleep(S)``, so the workers wait at the cell's end;
  - "collective": the same, then ``dist.all_reduce`` on every rank, so the workers wait in the collective
    (its comparison, :mod:`nbdist.cell.fingerprint`);

each run once with the sleep and once without it, between two snapshot cells as above. Per rank, ops per
second of waiting = (ops with the sleep - ops without it) / (seconds with it - seconds without it): the
cells' own traffic cancels out, the background (heartbeat, watcher, live table) stays in, as a waiting
rank spends it. It prints rank 0 (the sleeper, which also draws the live table) and the workers (median,
max), and writes no figures.

Run from the repository root::

    .venv/bin/python benchmarks/store_ops.py
    .venv/bin/python benchmarks/store_ops.py --world-sizes 2 4 --cells 100
    .venv/bin/python benchmarks/store_ops.py --waiting 3

Exits 0 when every world size was measured, 1 when one failed (its error is printed; the others are
still measured, and no figures are written).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import begin, figure, load_note, record
from driven_cells import Spawned, world_sizes
from vs_peers import require_ok

TRIVIAL = "%%collective\nx = 1"
# The recording cells: trivial %%collective cells whose bodies take a snapshot of this process's store counts.
SNAPSHOT = """%%collective
import time as _so_time, nbdist.world.store as _so_store
_so_before, _so_t0 = _so_store.COUNTS.snapshot(), _so_time.monotonic()"""
WRITE = """%%collective
_so_after, _so_t1 = _so_store.COUNTS.snapshot(), _so_time.monotonic()
import json as _so_json
with open(f"{directory}/{phase}-{{RANK}}.json", "w") as _so_file:
    _so_json.dump({{"rank": RANK, "size": WORLD_SIZE, "seconds": _so_t1 - _so_t0,
                   "moved": _so_store.StoreCounts.delta(_so_before, _so_after)}}, _so_file)"""
# --waiting: cells whose rank 0 sleeps while the others wait at the end, or in a collective.
WAITING = {
    "end": "%%collective\nimport time as _so_time\nif RANK == 0:\n    _so_time.sleep({seconds})",
    "collective": "%%collective\nimport time as _so_time, torch as _so_torch, torch.distributed as _so_dist\n"
                  "if RANK == 0:\n    _so_time.sleep({seconds})\n_so_dist.all_reduce(_so_torch.ones(1))",
}
GROWTH = 1.2  # a figure at the largest N more than this times its 2-rank figure "grows with N"


def phase(kernel: Any, directory: Path, name: str, n: int, cells: int, idle: float, timeout: float,
          cell: str = TRIVIAL) -> list[dict]:
    """One phase: snapshot cell, ``cells`` trivial cells (or ``cell``s) or ``idle`` seconds, snapshot cell; every
    rank's file."""
    require_ok(kernel.execute(SNAPSHOT, timeout), f"{name}: the first snapshot cell")
    for i in range(cells):
        require_ok(kernel.execute(cell, timeout), f"{name}: cell {i + 1}")
    if idle:
        time.sleep(idle)
    require_ok(kernel.execute(WRITE.format(directory=directory, phase=name), timeout), f"{name}: the second cell")
    found = []
    for rank in range(n):
        path = directory / f"{name}-{rank}.json"
        if not path.is_file():
            raise RuntimeError(f"{name}: rank {rank} wrote no counts ({path})")
        found.append(json.loads(path.read_text()))
    return found


def per_rank(cells: dict, idle: dict, k: int) -> dict[str, Any]:
    """One rank's figures per cell: raw (cells phase / (K+1)), net of the background, and the background rate."""
    out: dict[str, Any] = {"rank": cells["rank"]}
    tc, ti = cells["seconds"], idle["seconds"]
    def value(d: dict, metric: str) -> float:
        m = d["moved"]
        return m["ops"] if metric == "ops" else m["sent"] + m["received"]

    for metric in ("ops", "bytes"):
        raw = value(cells, metric) / (k + 1)
        # cells = (k+1) c + r tc; idle = c + r ti
        span = ti - tc / (k + 1)
        rate = max(0.0, (value(idle, metric) - raw) / span) if span > 0.5 else 0.0
        out[metric] = raw
        out[f"{metric}_net"] = (value(cells, metric) - rate * tc) / (k + 1)
        out[f"{metric}_per_s"] = rate
    out["kinds"] = {what: [v / (k + 1) for v in counts] for what, counts in cells["moved"]["kinds"].items()}
    out["get_if"] = cells["moved"]["get_if"] / (k + 1)
    out["seconds_per_cell"] = tc / (k + 1)
    return out


def kinds_line(kinds: dict[str, list[float]], top: int = 6) -> str:
    best = sorted(kinds.items(), key=lambda item: -item[1][0])[:top]
    return ", ".join(f"{what} {c[0]:.2f} ({c[1] + c[2]:.0f} B)" for what, c in best)


def median_kinds(ranks: list[dict]) -> dict[str, list[float]]:
    names = {what for r in ranks for what in r["kinds"]}
    return {what: [statistics.median(r["kinds"].get(what, [0, 0, 0])[i] for r in ranks) for i in range(3)]
            for what in names}


def report(n: int, k: int, ranks: list[dict]) -> dict[str, Any]:
    """Print one world size's figures; returns its summary."""
    zero, workers = ranks[0], ranks[1:]
    print(f"\n== {n} ranks: store traffic per trivial %%collective cell (cells phase: {k} trivial cells + the 2 "
          f"recording cells' halves = {k + 1} cells; per cell = difference / {k + 1}) ==")
    print(f"{'rank':>5} {'ops/cell':>9} {'net':>7} {'bg ops/s':>9} {'bytes/cell':>11} {'net':>9} {'bg B/s':>8} "
          f"{'get_if':>7} {'ms/cell':>8}")
    for r in ranks:
        print(f"{r['rank']:>5} {r['ops']:>9.2f} {r['ops_net']:>7.2f} {r['ops_per_s']:>9.2f} {r['bytes']:>11.0f} "
              f"{r['bytes_net']:>9.0f} {r['bytes_per_s']:>8.0f} {r['get_if']:>7.2f} "
              f"{r['seconds_per_cell'] * 1000:>8.1f}")
    summary: dict[str, Any] = {"n": n, "rank0": zero}
    for metric in ("ops", "bytes", "ops_net", "bytes_net", "ops_per_s"):
        values = [r[metric] for r in workers]
        summary[f"workers_{metric}"] = values
        summary[f"workers_{metric}_median"] = statistics.median(values)
        summary[f"workers_{metric}_max"] = max(values)
    summary["worker_kinds"] = median_kinds(workers)
    print(f"rank 0 (driving): {zero['ops']:.2f} ops/cell, {zero['bytes']:.0f} B/cell "
          f"(net of background {zero['ops_net']:.2f} ops, {zero['bytes_net']:.0f} B)")
    print(f"workers: median {summary['workers_ops_median']:.2f}, max {summary['workers_ops_max']:.2f} ops/cell; "
          f"median {summary['workers_bytes_median']:.0f}, max {summary['workers_bytes_max']:.0f} B/cell")
    print(f"top kinds, rank 0 (ops/cell, bytes/cell): {kinds_line(zero['kinds'])}")
    print(f"top kinds, workers' median (ops/cell, bytes/cell): {kinds_line(summary['worker_kinds'])}")
    return summary


def growth(summaries: list[dict]) -> list[str]:
    """Which figures grow with N: each at the largest N against the smallest, and every kind that grows."""
    if len(summaries) < 2:
        return ["growth with N: one world size only, nothing to compare"]
    lo, hi = summaries[0], summaries[-1]
    a, b = lo["n"], hi["n"]
    lines = [f"growth from {a} to {b} ranks (x{b / a:g} ranks; 'grows' = more than x{GROWTH:g}):"]
    pairs = [("rank 0 ops/cell", lo["rank0"]["ops"], hi["rank0"]["ops"]),
             ("rank 0 ops/cell net of background", lo["rank0"]["ops_net"], hi["rank0"]["ops_net"]),
             ("rank 0 bytes/cell", lo["rank0"]["bytes"], hi["rank0"]["bytes"]),
             ("workers' max ops/cell", lo["workers_ops_max"], hi["workers_ops_max"]),
             ("workers' median ops/cell net of background", lo["workers_ops_net_median"],
              hi["workers_ops_net_median"]),
             ("workers' max bytes/cell", lo["workers_bytes_max"], hi["workers_bytes_max"])]
    for label, x, y in pairs:
        ratio = y / x if x else float("inf")
        places = 0 if "bytes" in label else 2
        lines.append(f"  {label}: {x:.{places}f} -> {y:.{places}f} (x{ratio:.2f}) "
                     f"{'GROWS' if ratio > GROWTH else 'flat'}")
    for who, before, after in (("rank 0", lo["rank0"]["kinds"], hi["rank0"]["kinds"]),
                               ("workers' median", lo["worker_kinds"], hi["worker_kinds"])):
        grown, heavier = [], []
        for what in sorted(set(before) | set(after)):
            x, y = before.get(what, [0, 0, 0]), after.get(what, [0, 0, 0])
            if y[0] - x[0] > 0.5 and (not x[0] or y[0] / x[0] > GROWTH):
                grown.append(f"{what} {x[0]:.2f} -> {y[0]:.2f}")
            bx, by = x[1] + x[2], y[1] + y[2]
            if by - bx > 50 and (not bx or by / bx > GROWTH):
                heavier.append(f"{what} {bx:.0f} -> {by:.0f} B")
        lines.append(f"  {who}, kinds whose ops/cell grow: {', '.join(grown) or 'none'}")
        lines.append(f"  {who}, kinds whose bytes/cell grow: {', '.join(heavier) or 'none'}")
    return lines


def rows_for(s: dict[str, Any], k: int) -> list[dict[str, Any]]:
    n, zero = s["n"], s["rank0"]
    workers = f"workers (median; min–max over the {n - 1})"
    return [
        figure(f"store ops per cell, rank 0 (driving), {n} ranks", [], "", median=zero["ops"], runs=k + 1),
        figure(f"store ops per cell, {workers}, {n} ranks", s["workers_ops"], "", spread="min–max"),
        figure(f"store bytes sent+received per cell, rank 0, {n} ranks", [], "B", median=zero["bytes"], runs=k + 1,
               decimals=0),
        figure(f"store bytes sent+received per cell, {workers}, {n} ranks", s["workers_bytes"], "B",
               spread="min–max", decimals=0),
        figure(f"background store ops per second between cells, rank 0, {n} ranks", [], "",
               median=zero["ops_per_s"], runs=1),
        figure(f"background store ops per second between cells, {workers}, {n} ranks", s["workers_ops_per_s"], "",
               spread="min–max"),
    ]


def waiting_rates(slept: list[dict], awake: list[dict]) -> list[dict[str, Any]]:
    """Per rank: store ops (and bytes) per second of waiting, from a phase with rank 0's sleep and one without."""
    rates = []
    for s, a in zip(slept, awake, strict=True):
        seconds = s["seconds"] - a["seconds"]
        kinds = {what: (counts[0] - a["moved"]["kinds"].get(what, [0, 0, 0])[0]) / seconds
                 for what, counts in s["moved"]["kinds"].items()}
        rates.append({"rank": s["rank"], "seconds": seconds,
                      "ops_per_s": (s["moved"]["ops"] - a["moved"]["ops"]) / seconds,
                      "bytes_per_s": (s["moved"]["sent"] + s["moved"]["received"] - a["moved"]["sent"]
                                      - a["moved"]["received"]) / seconds,
                      "kinds": {what: v for what, v in kinds.items() if abs(v) >= 0.05}})
    return rates


def report_waiting(n: int, where: str, rates: list[dict]) -> dict[str, Any]:
    """Print one world size's waiting figures for one kind of wait; returns its summary."""
    zero, workers = rates[0], rates[1:]
    ops = [r["ops_per_s"] for r in workers]
    summary = {"n": n, "where": where, "rank0": zero["ops_per_s"], "median": statistics.median(ops), "max": max(ops)}
    top = sorted(workers[0]["kinds"].items(), key=lambda item: -item[1])[:5]
    print(f"{n} ranks, waiting at the {where} for {zero['seconds']:.1f} s: workers {summary['median']:.1f} ops/s "
          f"(median; max {summary['max']:.1f}), rank 0 (sleeping, drawing the table) {zero['ops_per_s']:.1f} ops/s; "
          f"rank 1's top kinds (ops/s): {', '.join(f'{w} {v:.1f}' for w, v in top)}", flush=True)
    return summary


def run_waiting(n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The waiting phases at ``n`` ranks (see ``--waiting``)."""
    spawned = Spawned(n)
    directory = Path(tempfile.mkdtemp(prefix=f"nbdist-store-ops-{n}-"))
    try:
        print(f"\n{n} ranks: starting one kernel and %dist_init --spawn {n} ...", flush=True)
        spawned.start(args.timeout)
        kernel = spawned.kernel
        assert kernel is not None
        got = require_ok(kernel.execute("", args.timeout, {"f": "__import__('nbdist').__file__"}), "nbdist's path")
        print(f"driving kernel imports nbdist from {got.expression('f')}", flush=True)
        for i in range(args.warmup):
            require_ok(kernel.execute(WAITING["collective"].format(seconds=0), args.timeout), f"warm-up cell {i + 1}")
        out = []
        for where, cell in WAITING.items():
            slept = phase(kernel, directory, f"{where}-slept", n, 1, 0.0, args.timeout,
                          cell.format(seconds=args.waiting))
            awake = phase(kernel, directory, f"{where}-awake", n, 1, 0.0, args.timeout, cell.format(seconds=0))
            out.append(report_waiting(n, where, waiting_rates(slept, awake)))
        return out
    finally:
        spawned.stop()
        shutil.rmtree(directory, ignore_errors=True)


def each_size(args: argparse.Namespace, measure: Callable[[int, argparse.Namespace], list[dict[str, Any]]]
              ) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """``measure`` at every world size: the summaries, and why each size that failed did."""
    summaries: list[dict[str, Any]] = []
    failed: dict[int, str] = {}
    for n in sorted(args.sizes):
        try:
            summaries.extend(measure(n, args))
        except Exception as exc:  # a kernel that did not start, a cell that failed: the other sizes still run
            failed[n] = f"{type(exc).__name__}: {exc}"
            print(f"FAILED at {n} ranks: {failed[n]}", file=sys.stderr, flush=True)
    return summaries, failed


def main_waiting(args: argparse.Namespace) -> int:
    """``--waiting``: store ops per rank per second of waiting, at each world size; prints, records nothing."""
    print(load_note("at start"), flush=True)
    summaries, failed = each_size(args, run_waiting)
    print(f"\nstore ops per rank per second of waiting (rank 0 sleeps {args.waiting:g} s in the body):")
    print(f"{'N':>3} {'waits at':>10} {'workers median':>15} {'workers max':>12} {'rank 0':>8}")
    for s in summaries:
        print(f"{s['n']:>3} {s['where']:>10} {s['median']:>15.1f} {s['max']:>12.1f} {s['rank0']:>8.1f}")
    print(load_note("at the end, this benchmark included", judge=False))
    for n, why in failed.items():
        print(f"{n} ranks: FAILED, not measured: {why}")
    return 1 if failed or not summaries else 0


def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    spawned = Spawned(n)
    directory = Path(tempfile.mkdtemp(prefix=f"nbdist-store-ops-{n}-"))
    try:
        print(f"\n{n} ranks: starting one kernel and %dist_init --spawn {n} ...", flush=True)
        t0 = time.perf_counter()
        spawned.start(args.timeout)
        print(f"world of {n} formed in {time.perf_counter() - t0:.1f} s; workers' pids {spawned.worker_pids}",
              flush=True)
        kernel = spawned.kernel
        assert kernel is not None
        got = require_ok(kernel.execute("", args.timeout, {"f": "__import__('nbdist').__file__"}), "nbdist's path")
        print(f"driving kernel imports nbdist from {got.expression('f')}", flush=True)
        for i in range(args.warmup):
            require_ok(kernel.execute(TRIVIAL, args.timeout), f"warm-up cell {i + 1}")
        cells = phase(kernel, directory, "cells", n, args.cells, 0.0, args.timeout)
        idle = phase(kernel, directory, "idle", n, 0, args.idle, args.timeout)
        ranks = [per_rank(c, i, args.cells) for c, i in zip(cells, idle, strict=True)]
        return report(n, args.cells, ranks)
    finally:
        spawned.stop()
        shutil.rmtree(directory, ignore_errors=True)


def summary_table(summaries: list[dict]) -> None:
    print("\nper trivial %%collective cell, per rank (raw: background between cells included):")
    print(f"{'N':>3} {'rank0 ops':>10} {'wk med ops':>11} {'wk max ops':>11} {'rank0 B':>9} {'wk med B':>9} "
          f"{'wk max B':>9} {'rank0 net ops':>14} {'wk med net ops':>15}")
    for s in summaries:
        z = s["rank0"]
        print(f"{s['n']:>3} {z['ops']:>10.2f} {s['workers_ops_median']:>11.2f} {s['workers_ops_max']:>11.2f} "
              f"{z['bytes']:>9.0f} {s['workers_bytes_median']:>9.0f} {s['workers_bytes_max']:>9.0f} "
              f"{z['ops_net']:>14.2f} {s['workers_ops_net_median']:>15.2f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", nargs="+", default=["2", "4", "8", "16"], metavar="N",
                   help="world sizes, each >= 2 (default: 2 4 8 16; '2,4' works too)")
    p.add_argument("--cells", type=int, default=50, help="trivial cells counted per world size (default 50)")
    p.add_argument("--warmup", type=int, default=3, help="uncounted warm-up cells (default 3)")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of the idle phase (default 5)")
    p.add_argument("--waiting", type=float, default=0.0, metavar="S",
                   help="measure store ops per second of waiting instead, rank 0 sleeping S s (see above)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any one cell may take (default 120; %%dist_init --spawn gets 120 s more)")
    args = p.parse_args(argv)
    args.sizes = world_sizes(p, args.world_sizes)
    if args.cells < 1 or args.warmup < 0 or args.idle < 1 or args.timeout <= 0 or args.waiting < 0:
        p.error("--cells must be >= 1, --warmup >= 0, --idle >= 1, --timeout > 0, --waiting >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.waiting:
        return main_waiting(args)
    began = begin()
    print(load_note("at start"), flush=True)
    summaries, failed = each_size(args, lambda n, a: [run_size(n, a)])
    summary_table(summaries)
    lines = growth(summaries)
    print("\n" + "\n".join(lines))
    print(load_note("at the end, this benchmark included", judge=False))
    for n, why in failed.items():
        print(f"{n} ranks: FAILED, not measured: {why}")
    if failed or not summaries:
        return 1
    rows = [row for s in summaries for row in rows_for(s, args.cells)]
    kinds = [f"{s['n']} ranks, top kinds per cell (ops, bytes): rank 0: {kinds_line(s['rank0']['kinds'])}; "
             f"workers' median: {kinds_line(s['worker_kinds'])}." for s in summaries]
    notes = [
        "Counted in each rank's process by `nbdist.world.store.COUNTS` (every `StoreClient` operation and "
        "wait; bytes are keys and values, not torch's framing; the pulse process's beats are not counted). "
        "For rank 0 the runs column is the cells counted; for the workers, how many workers. Background: "
        f"from an idle phase of {args.idle:g} s (see the script).", *kinds,
        "G" + lines[0].strip().rstrip(":")[1:] + ": " + "; ".join(line.strip() for line in lines[1:]) + "."]
    record("store_ops", f"Store operations and bytes per rank per trivial `%%collective` cell, driven "
           f"(`%dist_init --spawn N`; {args.cells} cells + the 2 recording cells' halves, per cell = difference / "
           f"{args.cells + 1}; background between cells included)", rows, began,
           [f"- {note}" for note in notes])
    return 0


if __name__ == "__main__":
    sys.exit(main())
