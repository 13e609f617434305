"""How much of a plain torch loop's bandwidth ``%dist_bench`` measures, in the same kernels, same run.

For each world size N (``--world-sizes``, default 2) this starts N local Jupyter kernels through
:mod:`nbdist.drive.kernels` and forms one world on a free loopback port (``%load_ext nbdist`` then
``%%dist_init`` in every kernel: peer notebooks, so that a plain cell runs on every rank). Then,
``--runs`` times (default 7), the two kinds alternate, which one goes first swapping run by run:

  (a) ``%dist_bench --ops ... --sizes ... --iters I --warmup W`` in every kernel at once;
  (b) a plain cell in every kernel at once: for each op and size, in the same order, the same
      buffers and calls as the bench makes (torch's own functions, the ``__nbdist_original__`` of
      nbdist's wrappers, so neither kind pays nbdist's per-collective checks), W untimed calls, then
      I calls each timed with ``time.perf_counter`` (after ``synchronize`` on cuda/npu); per rank the
      median; the slowest rank's median is the time, and busbw follows as for the bench
      (:func:`nbdist.measure.benchreport.row`).

Per op and size it prints the median busbw of each kind over the runs, their ratio (a) / (b), and
every run's ratio (a run's (a) over the (b) next to it); then the median of the per-op-and-size
ratios (the figure the target is judged on), the median of all paired per-run ratios, and the
target line. The
figures are gloo on loopback, on however many cores this machine has (see the load note).

Run from the repository root::

    .venv/bin/python benchmarks/bench_vs_raw.py
    .venv/bin/python benchmarks/bench_vs_raw.py --world-sizes 2,4 --runs 9 --sizes 1K,64K,1M,8M

Exits 0 when the measurements ran (whether or not the target is met), 1 when a cell failed.
"""

from __future__ import annotations

import argparse
import ast
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time

from _common import begin, figure, load_note, record

from nbdist.drive import kernels
from nbdist.measure.benchreport import OPS, format_size, parse_ops, parse_sizes, row
from nbdist.world import netinfo

TARGET_RATIO = 0.95
TARGET = "target: nbdist bench measures >= 0.95 of a plain torch loop's bandwidth (median ratio over ops and sizes)"

# A plain torch loop, run as a plain cell on every rank: leaves {"op size": median seconds} as JSON in _nb_raw.
PLAIN = """\
import json as _nb_json, statistics as _nb_stat, time as _nb_time
import torch as _nb_torch, torch.distributed as _nb_dist

def _nb_fn(name):
    fn = getattr(_nb_dist, name)
    return getattr(fn, "__nbdist_original__", fn)

def _nb_step(op, count, dt, dev, n, rank):
    z = lambda k: _nb_torch.zeros(k, dtype=dt, device=dev)
    if op == "all_reduce":
        b, f = z(count), _nb_fn("all_reduce"); return lambda: f(b)
    if op == "broadcast":
        b, f = z(count), _nb_fn("broadcast"); return lambda: f(b, src=0)
    if op == "all_gather":
        o, i, f = z(count), z(count // n), _nb_fn("all_gather_into_tensor"); return lambda: f(o, i)
    if op == "reduce_scatter":
        o, i, f = z(count // n), z(count), _nb_fn("reduce_scatter_tensor"); return lambda: f(o, i)
    if op == "all_to_all":
        o, i, f = z(count), z(count), _nb_fn("all_to_all_single"); return lambda: f(o, i)
    s, r = z(count), z(count)
    pair = [_nb_dist.P2POp(_nb_fn("isend"), s, (rank + 1) % n), _nb_dist.P2POp(_nb_fn("irecv"), r, (rank - 1) % n)]
    def ring():
        for w in _nb_dist.batch_isend_irecv(pair):
            w.wait()
    return ring

def _nb_plain(ops, counts, iters, warmup, dtype):
    dev, dt = DEVICE, getattr(_nb_torch, dtype)
    sync = {{"cuda": lambda: _nb_torch.cuda.synchronize(dev), "npu": lambda: _nb_torch.npu.synchronize()}}.get(dev.type)
    n, rank, out = _nb_dist.get_world_size(), _nb_dist.get_rank(), {{}}
    for op in ops:
        for count in counts[op]:
            step = _nb_step(op, count, dt, dev, n, rank)
            for _ in range(warmup):
                step()
            if sync:
                sync()
            times = []
            for _ in range(iters):
                t0 = _nb_time.perf_counter()
                step()
                if sync:
                    sync()
                times.append(_nb_time.perf_counter() - t0)
            out[f"{{op}} {{count}}"] = _nb_stat.median(times)
    return _nb_json.dumps(out)

_nb_raw = _nb_plain({ops!r}, {counts!r}, {iters}, {warmup}, {dtype!r})
"""


class BenchError(RuntimeError):
    """A cell failed or a kernel did not answer: the measurement is void."""


def check(results: list[kernels.Result], what: str) -> None:
    for rank, r in enumerate(results):
        if r.status != "ok":
            raise BenchError(f"rank {rank}: {what} failed: {r.error['evalue'] if r.error else r.status}")


def free_port() -> int:
    import secrets

    port = netinfo.first_free_port(secrets.randbelow(10_000) + 20_000 for _ in range(200))
    if port is None:
        raise BenchError("no free port in 20000-29999")
    return port


def form_world(ks: list[kernels.Kernel], port: int) -> None:
    check(kernels.execute_all(ks, "%load_ext nbdist", timeout=60), "%load_ext nbdist")
    n = len(ks)
    check(kernels.execute_all(ks, [f"%%dist_init --rank {i} --world-size {n} --master-addr 127.0.0.1 "
                                   f"--master-port {port}" for i in range(n)], timeout=180), "%%dist_init")


def run_bench(ks: list[kernels.Kernel], line: str) -> dict[tuple[str, int], dict]:
    """(a): %dist_bench on every rank; its rows by (op, count), from rank 0 (every rank holds the same)."""
    results = kernels.execute_all(ks, f"_nb_r = %dist_bench {line}", timeout=1800,
                                  user_expressions={"r": "__import__('json').dumps(list(_nb_r))"})
    check(results, "%dist_bench")
    rows = json.loads(ast.literal_eval(results[0].expression("r")))
    check(kernels.execute_all(ks, "del _nb_r", timeout=60), "cleaning up")
    return {(r["op"], r["count"]): r for r in rows}


def run_plain(ks: list[kernels.Kernel], code: str, itemsize: int, dtype: str) -> dict[tuple[str, int], dict]:
    """(b): the plain loop on every rank; the slowest rank's median per (op, count), as a bench row."""
    results = kernels.execute_all(ks, code, timeout=1800, user_expressions={"r": "_nb_raw"})
    check(results, "the plain loop")
    per_rank = [json.loads(ast.literal_eval(r.expression("r"))) for r in results]
    rows = {}
    for key in per_rank[0]:
        op, count = key.split()
        rows[(op, int(count))] = row(op, int(count), itemsize, dtype, [p[key] for p in per_rank])
    return rows


def run_size(n: int, args: argparse.Namespace, rows: list[dict]) -> list[float]:
    """Every run at world size ``n``; prints the table, adds the headline figures to ``rows`` (the median ratio,
    and each op's busbw at the largest size); returns the per-op-and-size ratios of medians."""
    from nbdist.measure.benchreport import element_count

    itemsize = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[args.dtype]
    ops = [op for op in args.ops if n > 1 or op != "send_recv"]
    counts = {op: sorted({element_count(op, s, itemsize, n) for s in args.sizes}) for op in ops}
    line = shlex.join(["--ops", ",".join(ops), "--sizes", ",".join(map(str, args.sizes)), "--iters",
                       str(args.iters), "--warmup", str(args.warmup), "--dtype", args.dtype])
    code = PLAIN.format(ops=ops, counts=counts, iters=args.iters, warmup=args.warmup, dtype=args.dtype)
    print(f"\n=== {n} ranks: %dist_bench {line} against a plain torch loop, {args.runs} runs interleaved ===",
          flush=True)
    started = time.perf_counter()
    # A private IPython directory: kernels that others start on this machine share the default history database,
    # and its "database is locked" retries would land in these kernels' time.
    ipython_dir = tempfile.mkdtemp(prefix="nbdist-bench-ipython-")
    ks = kernels.start(n, env={"IPYTHONDIR": ipython_dir})
    try:
        form_world(ks, free_port())
        run_bench(ks, line)  # warm-up of both kinds, not counted
        run_plain(ks, code, itemsize, args.dtype)
        bench_runs, plain_runs = [], []
        for i in range(args.runs):
            kinds = [("bench", lambda: run_bench(ks, line)), ("plain", lambda: run_plain(ks, code, itemsize,
                                                                                         args.dtype))]
            for kind, measure in kinds if i % 2 == 0 else reversed(kinds):
                (bench_runs if kind == "bench" else plain_runs).append(measure())
    finally:
        for k in reversed(ks):  # rank 0 hosts the server: stop it last
            k.shutdown()
        shutil.rmtree(ipython_dir, ignore_errors=True)
    print(f"{'op':<15}{'size':>6}  {'bench busbw':>12}  {'plain busbw':>12}  {'ratio':>6}   per-run ratios "
          "(GB/s; medians over the runs)")
    ratios: list[float] = []
    paired: list[float] = []
    largest: list[dict] = []  # each op's busbw at its largest size
    for op in ops:
        for count in counts[op]:
            key = (op, count)
            bench = statistics.median(r[key]["busbw_gbps"] for r in bench_runs)
            plain = statistics.median(r[key]["busbw_gbps"] for r in plain_runs)
            each = [b[key]["busbw_gbps"] / p[key]["busbw_gbps"] for b, p in zip(bench_runs, plain_runs, strict=True)]
            ratio = bench / plain
            ratios.append(ratio)
            paired += each
            if count == counts[op][-1]:
                size = format_size(count * itemsize)
                largest += [figure(f"{n} ranks, `{op}` {size}: busbw, {label}", [r[key]["busbw_gbps"] for r in runs],
                                   "GB/s", spread="min–max", decimals=3)
                            for label, runs in (("`%dist_bench`", bench_runs), ("plain torch loop", plain_runs))]
            print(f"{op:<15}{format_size(count * itemsize):>6}  {bench:>12.4f}  {plain:>12.4f}  {ratio:>6.3f}   "
                  + " ".join(f"{x:.2f}" for x in each))
    rows.append(figure(
        f"{n} ranks: `%dist_bench` busbw over the plain loop's (median of the ratios of medians per op and size; "
        "spread over ops and sizes)", ratios, "", spread="min–max", decimals=3, runs=args.runs,
        target=f"≥ {TARGET_RATIO:g}", met=statistics.median(ratios) >= TARGET_RATIO))
    rows += largest
    print(f"median ratio at {n} ranks: {statistics.median(ratios):.3f} (of the {len(ratios)} ratios of medians "
          f"above); median of all {len(paired)} paired per-run ratios: {statistics.median(paired):.3f} "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    return ratios


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2", help="comma list of world sizes (default 2)")
    parser.add_argument("--runs", type=int, default=7, help="runs of each kind, interleaved (default 7)")
    parser.add_argument("--ops", default=",".join(OPS), help="ops (default: all six)")
    parser.add_argument("--sizes", default="1K,64K,1M,8M", help="sizes S (default 1K,64K,1M,8M)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64", "float16", "bfloat16"))
    args = parser.parse_args(argv)
    args.world_sizes = [int(x) for x in args.world_sizes.split(",")]
    args.ops, args.sizes = list(parse_ops(args.ops)), list(parse_sizes(args.sizes))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = begin()
    print(load_note("at start"), flush=True)
    medians: dict[int, float] = {}
    rows: list[dict] = []
    try:
        for n in args.world_sizes:
            medians[n] = statistics.median(run_size(n, args, rows))
    except Exception as exc:  # a failed cell, a kernel that did not start or answer
        print(f"\nbench_vs_raw: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print()
    print(load_note("at the end, this benchmark included", judge=False))
    print("gloo on loopback; the NCCL and HCCL code path is the same (device tensors, synchronize) but unmeasured here")
    print(TARGET)
    for n, ratio in medians.items():
        print(f"  {'met' if ratio >= TARGET_RATIO else 'NOT met'}: median ratio {ratio:.3f} at {n} ranks")
    record("bench_vs_raw", "Bandwidth as `%dist_bench` measures it against a plain torch loop of the same calls, "
           f"same kernels, interleaved ({args.runs} runs of each)", rows, began,
           ["gloo on loopback, CPU; the NCCL and HCCL path is the same code (device tensors, a synchronize after "
            "each iteration) but unmeasured here."])
    return 0


if __name__ == "__main__":
    sys.exit(main())
