"""What a ``%%collective`` cell costs over a plain cell, seen from the notebook client.

For each world size N (``--world-sizes``, default 2,4) this starts N local
Jupyter kernels through :mod:`nbdist.kernels`, forms one world on a free
loopback port (``%load_ext nbdist`` then ``%%dist_init`` in every kernel), and
times, from the client, an execute request until every rank's cell is idle
(one :func:`nbdist.kernels.execute_all` call for all ranks together) for:

  (a) a plain cell ``x = 1``
  (b) a trivial ``%%collective`` cell ``x = 1``
  (c) a small all_reduce ``%%collective`` cell ``t = torch.ones(4); dist.all_reduce(t)``
  (d) the same with ``--no-check`` (no collective fingerprints): (c) - (d) is their cost

The three kinds are interleaved run by run, after a few warm-up rounds that are
not counted. It prints median and p90 per kind and the overhead of (b) over (a)
(difference of medians, the median of the paired per-round differences, and the
ratio of medians), then the target line for 2 ranks.

Unless ``--inner 0``, it then also times, inside the kernels (every rank at
once, in one plain cell), the pieces a ``%%collective`` cell is made of:
``Session.collective`` (barrier, body, publish, barrier, gather), one
``World.barrier``, ``capture.run_cell`` of the body, rendering the side-by-side
table (what ``display`` formats), and a bare ``dist.all_reduce``. Unless
``--no-profile``, it finally runs ``--runs`` more trivial ``%%collective``
cells from the client with timing wrappers installed in the kernels (this
benchmark's kernels only; nbdist's files are not touched) and prints, per
rank, what each piece and each store operation costs per cell.

Run from the repository root::

    .venv/bin/python benchmarks/cell_overhead.py
    .venv/bin/python benchmarks/cell_overhead.py --world-sizes 2 --runs 100

Exits 0 when the measurements ran (whether or not the target is met), 1 when a
cell failed or timed out.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import socket
import statistics
import sys
import time

from _common import load_note

from nbdist import kernels

KINDS = [
    ("plain", "(a) plain cell  x = 1", "x = 1"),
    ("trivial", "(b) %%collective  x = 1", "%%collective\nx = 1"),
    ("allreduce", "(c) %%collective  all_reduce(ones(4))", "%%collective\nt = torch.ones(4); dist.all_reduce(t)"),
    ("nocheck", "(d) %%collective --no-check  all_reduce",
     "%%collective --no-check\nt = torch.ones(4); dist.all_reduce(t)"),
]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TARGET_MS = 3.0
TARGET = "target: trivial %%collective adds <= 3 ms median over a plain cell at 2 ranks"

# Runs in every kernel at once as one plain cell; leaves a JSON string in _nbdist_bench.
INNER_CODE = """\
import json as _nb_json, time as _nb_time
import torch as _nb_torch, torch.distributed as _nb_dist
from nbdist import capture as _nb_capture, display as _nb_display
_nb_shell = get_ipython()
_nb_session = _nb_shell.magics_manager.registry["DistMagics"].session
_nb_world = _nb_session.world

def _nb_times(fn, n):
    out = []
    for _ in range(n):
        t0 = _nb_time.perf_counter()
        fn()
        out.append(_nb_time.perf_counter() - t0)
    return out

_nb_count = [0]  # every rank numbers its benchmark barriers alike

def _nb_barrier():
    _nb_count[0] += 1
    _nb_world.barrier(f"bench/{{_nb_count[0]}}", 60, "cell_overhead barrier")

def _nb_all_reduce():
    _nb_t = _nb_torch.ones(4)
    _nb_dist.all_reduce(_nb_t)

_nb_out = _nb_session.collective("x = 1", 60)  # (number, captures) or an object with .captures
_nb_caps = _nb_out[1] if isinstance(_nb_out, tuple) else _nb_out.captures
_nb_table = _nb_display.cell_table("t", _nb_world.ranks, _nb_caps)
_nb_times(_nb_barrier, 5)  # warm-up
_nb_bench = {{
    "Session.collective(x = 1)": _nb_times(lambda: _nb_session.collective("x = 1", 60), {n}),
    "Session.collective(all_reduce)": _nb_times(
        lambda: _nb_session.collective("t = torch.ones(4); dist.all_reduce(t)", 60), {n}),
    "World.barrier": _nb_times(_nb_barrier, {n}),
    "capture.run_cell(x = 1)": _nb_times(lambda: _nb_capture.run_cell(_nb_shell, "x = 1"), {n}),
    "format side-by-side table": _nb_times(lambda: _nb_shell.display_formatter.format(_nb_table), {n}),
    "dist.all_reduce(ones(4))": _nb_times(_nb_all_reduce, {n}),
}}
_nbdist_bench = _nb_json.dumps(_nb_bench)
"""


# Installs timing wrappers in one kernel (only in this benchmark's kernels; nbdist is not changed):
# store operations on the world's own connection, World.barrier, Session.collective,
# capture.run_cell, the magic's display() and parse_argstring, and the %%collective magic
# as registered. Samples go to _nb_prof.
PROFILE_CODE = """\
import collections as _nb_collections, time as _nb_time
from nbdist import capture as _nb_capture, magics as _nb_magics
_nb_prof = _nb_collections.defaultdict(list)
_nb_sess = get_ipython().magics_manager.registry["DistMagics"].session

def _nb_timed(name, fn, only=None):
    def wrapper(*args, **kwargs):
        if only is not None and args[0] is not only():
            return fn(*args, **kwargs)
        t0 = _nb_time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _nb_prof[name].append(_nb_time.perf_counter() - t0)
    return wrapper

def _nb_wrap(owner, attr, name, only=None):
    if hasattr(owner, attr):
        setattr(owner, attr, _nb_timed(name, getattr(owner, attr), only))

# The classes in use, wherever nbdist defines them.
for _nb_op in ("set", "get", "add", "compare_set", "wait", "multi_get", "check"):
    _nb_wrap(type(_nb_sess.client), _nb_op, f"store.{_nb_op}", only=lambda: _nb_sess.client)
_nb_wrap(type(_nb_sess.world), "barrier", "World.barrier")
_nb_wrap(type(_nb_sess), "collective", "Session.collective")
_nb_wrap(_nb_capture, "run_cell", "capture.run_cell")
_nb_wrap(_nb_magics, "display", "display(table) (format + publish)")
_nb_wrap(_nb_magics, "parse_argstring", "parse_argstring")
_nb_cells = get_ipython().magics_manager.magics["cell"]
_nb_cells["collective"] = _nb_timed("%%collective magic", _nb_cells["collective"])
"""

# What the wrappers saw: per name, (samples, median s, total s).
PROFILE_READ = "{k: (len(v), sorted(v)[len(v) // 2], sum(v)) for k, v in _nb_prof.items()}"


class BenchError(RuntimeError):
    """A cell failed or a kernel did not answer: the measurement is void."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def p90_ms(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] * 1000
    return statistics.quantiles(values, n=10, method="inclusive")[8] * 1000


def check(results: list[kernels.Result], what: str) -> None:
    for rank, r in enumerate(results):
        if r.status != "ok":
            detail = r.error["evalue"] if r.error else r.status
            raise BenchError(f"rank {rank}: {what} failed: {detail}\n{ANSI.sub('', r.text())}")


def form_world(ks: list[kernels.Kernel], port: int, timeout: float) -> None:
    check(kernels.execute_all(ks, "%load_ext nbdist", timeout=timeout), "%load_ext nbdist")
    n = len(ks)
    inits = [
        f"%%dist_init --rank {i} --world-size {n} --master-addr 127.0.0.1 --master-port {port} --timeout {timeout:g}"
        for i in range(n)
    ]
    check(kernels.execute_all(ks, inits, timeout=timeout + 30), "%%dist_init")


def time_cells(ks: list[kernels.Kernel], runs: int, warmup: int, timeout: float) -> dict[str, list[float]]:
    """Client-side wall time per kind, kinds interleaved round by round."""
    times: dict[str, list[float]] = {key: [] for key, _, _ in KINDS}
    for round_ in range(warmup + runs):
        for key, label, code in KINDS:
            start = time.perf_counter()
            results = kernels.execute_all(ks, code, timeout=timeout)
            elapsed = time.perf_counter() - start
            check(results, label)
            if round_ >= warmup:
                times[key].append(elapsed)
    # The all_reduce really ran: every rank holds world_size in each element.
    got = kernels.execute_all(ks, "pass", timeout=timeout, user_expressions={"t": "t.tolist()"})
    check(got, "reading t")
    want = [float(len(ks))] * 4
    for rank, r in enumerate(got):
        value = ast.literal_eval(r.expression("t"))
        if value != want:
            raise BenchError(f"rank {rank}: all_reduce gave {value}, expected {want}")
    return times


def time_inside(ks: list[kernels.Kernel], n: int, timeout: float) -> dict[str, list[float]]:
    """Per-piece times measured inside the kernels; every rank's samples pooled."""
    results = kernels.execute_all(
        ks, INNER_CODE.format(n=n), timeout=timeout, user_expressions={"b": "_nbdist_bench"}
    )
    check(results, "in-kernel timing")
    pooled: dict[str, list[float]] = {}
    for r in results:
        for key, values in json.loads(ast.literal_eval(r.expression("b"))).items():
            pooled.setdefault(key, []).extend(values)
    return pooled


def profile(ks: list[kernels.Kernel], runs: int, timeout: float) -> tuple[list[dict[str, tuple]], list[float]]:
    """Trivial %%collective cells with timing wrappers in the kernels: where the time goes."""
    check(kernels.execute_all(ks, PROFILE_CODE, timeout=timeout), "installing the profiler")
    client: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        results = kernels.execute_all(ks, KINDS[1][2], timeout=timeout)
        client.append(time.perf_counter() - start)
        check(results, "profiled %%collective")
    got = kernels.execute_all(ks, "pass", timeout=timeout, user_expressions={"p": PROFILE_READ})
    check(got, "reading the profile")
    return [ast.literal_eval(r.expression("p")) for r in got], client


def report_profile(n: int, per_rank: list[dict[str, tuple]], client: list[float], runs: int) -> None:
    print(f"-- {n} ranks: where a trivial %%collective's time goes ({runs} client-driven cells, "
          "timing wrappers in the kernels) --")
    print(f"client wall time with the wrappers: median {median_ms(client):.2f} ms, p90 {p90_ms(client):.2f} ms")
    print(f"{'piece (per cell, per rank)':<34}" + "".join(f"{'rank ' + str(i) + ': n  median  total ms':>28}"
                                                         for i in range(len(per_rank))))
    order = ["%%collective magic", "parse_argstring", "Session.collective", "World.barrier", "capture.run_cell",
             "display(table) (format + publish)"]
    seen = {k for p in per_rank for k in p}
    names = [k for k in order if k in seen] + sorted(seen - set(order))
    for name in names:
        row = f"{name:<34}"
        for p in per_rank:
            count, med, total = p.get(name, (0, 0.0, 0.0))
            row += f"{count / runs:>10.1f} {med * 1000:>7.3f} {total * 1000 / runs:>9.3f}"
        print(row)
    print("(n = calls per cell; median = of one call; total = ms per cell. store.* counts only the world's "
          "own connection, not the heartbeat's. Per-op times are round trips to the server in rank 0's kernel.)")


def report(n: int, times: dict[str, list[float]], runs: int) -> float:
    """Print the table for one world size; returns the added median (b) - (a) in ms."""
    print(f"\n== {n} ranks: client wall time, execute request -> every rank idle ({runs} runs each) ==")
    print(f"{'cell':<42} {'median ms':>10} {'p90 ms':>10}")
    for key, label, _ in KINDS:
        print(f"{label:<42} {median_ms(times[key]):>10.2f} {p90_ms(times[key]):>10.2f}")
    plain, trivial = times["plain"], times["trivial"]
    added = median_ms(trivial) - median_ms(plain)
    paired = statistics.median(b - a for a, b in zip(plain, trivial, strict=True)) * 1000
    ratio = median_ms(trivial) / median_ms(plain)
    print(f"(b) over (a): {added:+.2f} ms median (difference of medians; median of paired differences "
          f"{paired:+.2f} ms), ratio {ratio:.2f}x")
    allreduce_added = median_ms(times["allreduce"]) - median_ms(plain)
    print(f"(c) over (a): {allreduce_added:+.2f} ms median")
    check_cost = median_ms(times["allreduce"]) - median_ms(times["nocheck"])
    print(f"(c) over (d): {check_cost:+.2f} ms median: what comparing one collective's fingerprint across ranks costs")
    return added


def report_inside(n: int, pooled: dict[str, list[float]], per_rank: int) -> None:
    print(f"-- {n} ranks: inside the kernels ({per_rank} runs per rank, all {n} ranks pooled) --")
    print(f"{'piece':<42} {'median ms':>10} {'p90 ms':>10}")
    for key, values in pooled.items():
        print(f"{key:<42} {median_ms(values):>10.3f} {p90_ms(values):>10.3f}")


def run_size(n: int, args: argparse.Namespace) -> float:
    port = free_port()
    print(f"\nstarting {n} kernels; rendezvous 127.0.0.1:{port}", flush=True)
    started = time.perf_counter()
    ks = kernels.start(n)
    try:
        form_world(ks, port, args.timeout)
        print(f"world of {n} formed {time.perf_counter() - started:.1f} s after the kernels were started", flush=True)
        times = time_cells(ks, args.runs, args.warmup, args.timeout)
        added = report(n, times, args.runs)
        if args.inner > 0:
            report_inside(n, time_inside(ks, args.inner, args.timeout + args.inner), args.inner)
        if args.profile:
            per_rank, client = profile(ks, args.runs, args.timeout)
            report_profile(n, per_rank, client, args.runs)
        return added
    finally:
        for k in reversed(ks):  # rank 0 hosts the server: stop it last
            try:
                k.shutdown()
            except Exception as exc:  # keep shutting the others down
                print(f"warning: kernel shutdown failed: {exc}", file=sys.stderr)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", default="2,4", help="comma-separated world sizes (default 2,4)")
    p.add_argument("--runs", type=int, default=30, help="counted runs per kind (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="uncounted warm-up rounds (default 3)")
    p.add_argument("--inner", type=int, default=100,
                   help="in-kernel iterations per piece; 0 skips the in-kernel timing (default 100)")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the per-store-operation profile of client-driven %%%%collective cells")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any one cell may take (default 60)")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.world_sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--world-sizes must be comma-separated integers, not {args.world_sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        p.error("--world-sizes needs at least one size >= 1")
    if args.runs < 2 or args.warmup < 0 or args.inner < 0:
        p.error("--runs must be >= 2; --warmup and --inner >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(load_note("at start"), flush=True)
    added: dict[int, float] = {}
    try:
        for n in args.sizes:
            added[n] = run_size(n, args)
    except Exception as exc:  # a failed cell, a kernel that did not start or answer
        print(f"\ncell_overhead: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print()
    print(load_note("at the end, this benchmark included", judge=False))
    print(TARGET)
    if 2 in added:
        verdict = "met" if added[2] <= TARGET_MS else "NOT met"
        print(f"  {verdict}: {added[2]:+.2f} ms median at 2 ranks")
    else:
        print("  not measured (2 is not among --world-sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
