"""How long nbdist takes to draw one cell's table for many ranks (issue 24's target: 64 ranks x 200 lines, <= 50 ms).

Pure rendering, no kernels: the captures are what 64 ranks would publish, each
200 lines of stdout. Timed: ``cell_table(...)`` and both of its forms (the
HTML a notebook shows and the text form), as the final table is drawn.
Shapes:

- ``numbers``: every rank prints the same 200 lines with its own loss values
  (one group, a template with a summary per number);
- ``parity``: even and odd ranks print different lines, each with its own
  values (two groups);
- ``distinct``: every rank prints a line no other prints (64 groups: the
  reference, three diffs, 60 behind "… more groups");
- ``ranks``: ``--view ranks`` on the ``numbers`` shape (64 columns).

Prints the median and spread of ``--runs`` runs per shape, and the HTML size.

    python benchmarks/many_ranks_render.py [--ranks 64] [--lines 200] [--runs 21]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import begin, figure, load_note, record

from nbdist.view.celltable import cell_table


def captures(shape: str, ranks: int, lines: int, run: int) -> list[dict]:
    """What each rank publishes; ``run`` changes every value, so that no run finds another's work cached."""
    out = []
    for r in range(ranks):
        r += run * ranks
        if shape == "distinct":
            body = [f"step {i} loss {2.3 - i * 1e-3 + r * 1e-5:.5f}" for i in range(lines - 1)]
            body.append(f"rank-{chr(65 + r % 26)}{r}")  # a line no other rank prints
        elif shape == "parity":
            word = "even" if r % 2 == 0 else "odd"  # (r shifted by a multiple of ranks: ranks is even)
            body = [f"{word} step {i} loss {2.3 - i * 1e-3 + r * 1e-5:.5f}" for i in range(lines)]
        else:
            body = [f"step {i} loss {2.3 - i * 1e-3 + r * 1e-5:.5f}" for i in range(lines)]
        out.append({"outputs": [{"kind": "stdout", "text": "\n".join(body) + "\n"}], "result": None, "error": None,
                    "wall": 1.0 + r / 1000})
    return out


def once(shape: str, ranks: int, lines: int, run: int) -> tuple[float, int]:
    infos = [{"host": f"node-{r // 8}"} for r in range(ranks)]
    caps = captures(shape, ranks, lines, run)
    started = time.perf_counter()
    table = cell_table(f"%%collective #1 · {ranks} ranks", infos, caps, view="ranks" if shape == "ranks" else None)
    bundle = table._repr_mimebundle_()
    return time.perf_counter() - started, len(bundle["text/html"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    began = begin()
    rows = []
    print(f"{args.ranks} ranks x {args.lines} lines, {args.runs} runs per shape; {load_note('before')}")
    for shape in ("numbers", "parity", "distinct", "ranks"):
        once(shape, args.ranks, args.lines, 0)  # warm: imports, regex compilation
        times, size = [], 0
        for run in range(1, args.runs + 1):
            took, size = once(shape, args.ranks, args.lines, run)
            times.append(took * 1000)
        q = statistics.quantiles(times, n=4)
        met = "met" if statistics.median(times) <= 50 else "NOT met"
        verdict = "" if shape == "ranks" else f"  target <= 50 ms: {met}"
        rows.append(figure(f"`{shape}`" + (" (`--view ranks`)" if shape == "ranks" else ""), times, "ms", decimals=1,
                           **({} if shape == "ranks" else {"target": "≤ 50 ms", "met": met == "met"})))
        print(f"{shape:9s} median {statistics.median(times):7.1f} ms  (quartiles {q[0]:.1f}-{q[2]:.1f} ms)  "
              f"html {size / 1e3:7.0f} kB{verdict}")
    print(load_note("after"))
    record("many_ranks_render", f"Drawing one cell's table for {args.ranks} ranks × {args.lines} lines "
           "(`cell_table` and both its forms, HTML and text; no kernels)", rows, began)


if __name__ == "__main__":
    main()
