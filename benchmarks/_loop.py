"""cell_overhead.py's loop figure: what each collective costs inside a cell, in a loop.

In one world (the kernels cell_overhead.py formed), every rank runs one cell
that times a loop of ``n`` one-element ``all_reduce`` calls inside the kernel:
wall time per call (``time.perf_counter``) and the main thread's own CPU time
per call (``time.thread_time``, which other processes on the cores disturb far
less). Kinds, interleaved round by round (the order rotates each round):

  raw        torch's own ``all_reduce`` (the function nbdist's wrapper calls), in a plain cell
  plain      ``dist.all_reduce`` in a plain cell (nbdist's wrapper: the plain-cell safety net)
  checked    the same inside ``%%collective`` (fingerprints compared)
  no-check   inside ``%%collective --no-check``
  trace      inside ``%%collective --trace`` (checked, and every call recorded)

Each round's figure for a kind is the largest over the ranks; the report gives
medians over rounds and ratios of medians to ``raw``, then the target lines.
``--pin`` gives each kernel's threads a core of its own, which narrows the spread.
What ``--trace`` adds is below the noise of these loops, so it is also timed
alone (:func:`recording_cost`): nbdist's ``Checker.call`` around a no-op, with
and without recording, in the benchmark's own process.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from _common import figure

from nbdist.drive import kernels

SETUP = """\
import time as _nb_time, torch as _nb_torch, torch.distributed as _nb_dist
_nb_raw_all_reduce = _nb_dist.all_reduce.__nbdist_original__

def _nb_loop(f, n):
    x = _nb_torch.ones(1)
    f(x)  # the first call of its kind in a cell is compared before it runs: not counted
    w0, c0 = _nb_time.perf_counter(), _nb_time.thread_time()
    for _ in range(n):
        f(x)
    return [(_nb_time.perf_counter() - w0) / n * 1e6, (_nb_time.thread_time() - c0) / n * 1e6]
"""

KINDS = [
    ("raw", "torch's own all_reduce, plain cell", "_nb_loop_us = _nb_loop(_nb_raw_all_reduce, {n})"),
    ("plain", "dist.all_reduce, plain cell (wrapped)", "_nb_loop_us = _nb_loop(_nb_dist.all_reduce, {n})"),
    ("checked", "%%collective", "%%collective\n_nb_loop_us = _nb_loop(_nb_dist.all_reduce, {n})"),
    ("nocheck", "%%collective --no-check", "%%collective --no-check\n_nb_loop_us = _nb_loop(_nb_dist.all_reduce, {n})"),
    ("trace", "%%collective --trace", "%%collective --trace\n_nb_loop_us = _nb_loop(_nb_dist.all_reduce, {n})"),
]
TARGETS = [
    ("checked", 1.30, "target: a checked all_reduce in %%collective costs <= 1.3x raw"),
    ("nocheck", 1.05, "target: with --no-check, <= 1.05x raw"),
]
TRACE_TARGET_US = 2.0
TRACE_TARGET = "target: --trace records a collective in <= 2 us"
DOC_LABELS = {
    "raw": "torch's own `all_reduce`, plain cell",
    "plain": "`dist.all_reduce`, plain cell (nbdist's wrapper)",
    "checked": "`%%collective` (checked)",
    "nocheck": "`%%collective --no-check`",
    "trace": "`%%collective --trace`",
}


def pin(ks: list[kernels.Kernel]) -> list[int] | None:
    """Give each kernel's threads a core of their own (rank i on core i), if there are as many cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < len(ks):
        return None
    for core, k in zip(cores, ks, strict=False):
        pid = k.manager.provisioner.process.pid
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), {core})
    return cores[: len(ks)]


def time_loop(ks: list[kernels.Kernel], runs: int, n: int, timeout: float,
              check: Any, pinned: bool = False) -> dict[str, list[tuple[float, float]]]:
    """Per kind, per round: (wall µs, CPU µs) per call, each the largest over the ranks."""
    check(kernels.execute_all(ks, SETUP, timeout=timeout), "defining the loop")
    if pinned:
        print(f"loop figure: kernels pinned to cores {pin(ks)}", flush=True)
    seen: dict[str, list[tuple[float, float]]] = {key: [] for key, _, _ in KINDS}
    for round_ in range(runs + 1):  # round 0 warms up
        order = KINDS[round_ % len(KINDS):] + KINDS[:round_ % len(KINDS)]
        for key, label, code in order:
            results = kernels.execute_all(ks, code.format(n=n), timeout=timeout,
                                          user_expressions={"u": "_nb_loop_us"})
            check(results, f"loop: {label}")
            per_rank = [eval_pair(r.expression("u")) for r in results]
            if round_ > 0:
                seen[key].append((max(w for w, _ in per_rank), max(c for _, c in per_rank)))
    return seen


def eval_pair(text: str) -> tuple[float, float]:
    wall, cpu = (float(v) for v in text.strip("[] ").split(","))
    return wall, cpu


def report_loop(n_ranks: int, seen: dict[str, list[tuple[float, float]]],
                n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Print the loop figure; returns the target lines with their verdicts, and the headline figures."""
    runs = len(seen["raw"])
    print(f"-- {n_ranks} ranks: the loop figure: {n} one-element all_reduces timed inside the kernel, "
          f"{runs} rounds, kinds interleaved (per round: the largest over the ranks) --")
    wall = {k: statistics.median(w for w, _ in v) for k, v in seen.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in seen.items()}
    print(f"{'kind':<40} {'wall µs/call':>13} {'x raw':>7} {'CPU µs/call':>12} {'x raw':>7}")
    for key, label, _ in KINDS:
        print(f"{label:<40} {wall[key]:>13.1f} {wall[key] / wall['raw']:>6.2f}x {cpu[key]:>12.1f} "
              f"{cpu[key] / cpu['raw']:>6.2f}x")
    for key, _, _ in KINDS:
        print(f"  {key} every round, wall µs: " + " ".join(f"{w:.0f}" for w, _ in seen[key]))
    rows = [figure(f"loop: {DOC_LABELS[key]}, wall per call, {n_ranks} ranks", [w for w, _ in seen[key]], "µs",
                   decimals=1) for key, _, _ in KINDS]
    lines = []
    for key, limit, text in TARGETS:
        ratio = wall[key] / wall["raw"]
        rows.append(figure(f"loop: {DOC_LABELS[key]} over raw (ratio of medians)", [], "x", median=ratio, runs=runs,
                           target=f"≤ {limit:g}x", met=ratio <= limit))
        lines.append(f"{text}\n  {'met' if ratio <= limit else 'NOT met'}: {ratio:.2f}x "
                     f"({wall[key]:.1f} against {wall['raw']:.1f} µs, medians of wall time)")
    checked, traced = recording_cost()
    extra = traced - checked
    print(f"recording alone (Checker.call around a no-op, this process, CPU): checked {checked:.2f} µs, "
          f"--trace {traced:.2f} µs per call")
    lines.append(f"{TRACE_TARGET}\n  {'met' if extra <= TRACE_TARGET_US else 'NOT met'}: {extra:+.2f} µs per call "
                 f"(nbdist's own Python, timed around a no-op; in the loop above: {cpu['trace'] - cpu['checked']:+.1f} "
                 f"µs CPU, {wall['trace'] - wall['checked']:+.1f} µs wall, within the noise)")
    rows.append(figure("`--trace`: recording one call (`Checker.call` around a no-op, CPU; median of 7 repeats)", [],
                       "µs", median=extra, runs=7, signed=True, target=f"≤ {TRACE_TARGET_US:g} µs",
                       met=extra <= TRACE_TARGET_US))
    return lines, rows


def recording_cost(n: int = 50_000) -> tuple[float, float]:
    """What --trace adds to one call, without the collective: Checker.call around a no-op, in this process.

    A world of one rank (gloo, a free loopback port) gives torch a default group; the "collective" is a
    function that returns at once, so only nbdist's own Python is timed: (checked, traced) µs per call,
    medians of 7 repeats of ``n`` calls (main thread CPU time).
    """
    import socket
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from nbdist.cell.fingerprint import Checker
    from nbdist.cell.hooks import Collectives

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        hooks = Collectives()
        hooks.install()
        params = dict(hooks.params)
        hooks.uninstall()
        world = SimpleNamespace(rank=0, world_size=1, pg=None, key=lambda name: f"nbdist/r/0/{name}")  # no store read
        x = torch.ones(1)

        def noop(*args: Any, **kwargs: Any) -> None:
            return None

        def per_call(trace: bool) -> float:
            checker = Checker(world, "bench", 10.0, params, compare=True, trace=trace)  # type: ignore[arg-type]
            checker.agree = lambda *a, **k: None  # type: ignore[method-assign]  # the first of its kind: no store
            samples = []
            for _ in range(7):
                if checker.events is not None:
                    checker.events.clear()
                t0 = time.thread_time()
                for _ in range(n):
                    checker.call("all_reduce", noop, (x,), {})
                samples.append((time.thread_time() - t0) / n * 1e6)
            return statistics.median(samples)

        per_call(False)  # warm up
        return per_call(False), per_call(True)
    finally:
        dist.destroy_process_group()
