"""What comparing replicas costs (issue 48, item 5): ``%dist_compare`` of a 10M-parameter model, the length of its
answer at 16 ranks in two groups, and ``nbdist.check_replicas(every=10)`` against a small DDP step.

1. A driven world of ``--ranks`` (4) ranks (``%dist_init --spawn``), each holding the same 10M-parameter model
   (seeded alike): the client's wall time of ``%dist_compare model``, all alike, and again with one bias differing
   on the last rank (its elements fetched). Target: ≤ 1 s.
2. The answer at ``--output-ranks`` (16) ranks, two groups: the lines every rank prints, from the same decision the
   ranks make (:func:`nbdist.diverge.compare.decide`, no kernels), and the whole cell's text at ``--ranks``.
3. A small DDP training step at 2 ranks (gloo, CPU, processes of this script), in pairs of blocks of 10 steps,
   one without and one with ``check_replicas(model, opt, every=10)`` (one check per block), interleaved
   ``--steps / 10`` pairs a round: the median step time of each kind, the cost as the median of the paired
   differences over the plain step's median, and the time spent inside ``check_replicas`` (the slower rank's,
   its collective's wait for the other rank included) against the plain step. Target: ≤ 5% more. On 2 cores
   shared by both ranks a block's time varies by ±20%, more than the difference sought: many short pairs, not a
   few long rounds.

Run from the repository root::

    .venv/bin/python benchmarks/compare.py
    .venv/bin/python benchmarks/compare.py --runs 5 --ranks 2

Writes ``docs/figures/compare.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import begin, figure, load_note, record  # noqa: E402

MODEL = """%%collective
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1000, 1000) for _ in range(10)])  # 10.01M parameters
"""
PARTED = """%%collective
if RANK == WORLD_SIZE - 1:
    with torch.no_grad():
        model[9].bias[7] += 1.0
"""


def compare_times(ranks: int, runs: int) -> tuple[list[float], list[float], str]:
    from nbdist.drive import kernels

    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        r = k.execute(f"%dist_init --spawn {ranks}", timeout=600)
        assert r.status == "ok", r.error
        assert k.execute(MODEL, timeout=300).status == "ok"
        alike = [_timed(k, "%dist_compare model") for _ in range(runs)]
        assert k.execute(PARTED, timeout=120).status == "ok"
        parted = [_timed(k, "%dist_compare model") for _ in range(runs)]
        text = k.execute("%dist_compare model", timeout=300).text()
    finally:
        k.shutdown()
    return alike, parted, text


def _timed(k, line: str) -> float:
    started = time.perf_counter()
    r = k.execute(line, timeout=300)
    assert r.status == "ok", r.error
    return time.perf_counter() - started


def answer_at(n: int) -> str:
    """The answer every rank prints at ``n`` ranks, the upper half's bias differing in one element."""
    from nbdist.diverge.compare import Held, Probe, decide
    from nbdist.diverge.hashing import MODULE, TENSOR, Entry

    def held(digest: str) -> Held:
        return Held(MODULE, "Sequential", tuple(
            [Entry(f"{i}.{p}", TENSOR, "w" if p == "weight" else "b", (1000, 1000) if p == "weight" else (1000,),
                   "torch.float32") for i in range(9) for p in ("weight", "bias")]
            + [Entry("9.weight", TENSOR, "w", (1000, 1000), "torch.float32"),
               Entry("9.bias", TENSOR, digest, (1000,), "torch.float32")]))
    every = [held("a" if r < n // 2 else "b") for r in range(n)]
    probes = {"9.bias": {r: Probe(1, 1000, ((7, "1.0123", "0.0123"),), 1.0, 81.3) for r in range(n // 2, n)}}
    return "\n".join(decide("model", every, probes).lines)


def _ddp_worker(rank: int, size: int, port: int, steps: int, rounds: int, out: object) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from nbdist.diverge.replicas import check_replicas

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 10))
    model = DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    times: dict[str, list[float]] = {"plain": [], "checked": [], "in_check": []}
    every = 10
    for _ in range(rounds):
        dist.barrier()
        blocks = []  # per pair of blocks of `every` steps: plain, checked, inside the check
        for _ in range(steps // every):
            pair = []
            for kind in ("plain", "checked"):
                started = time.perf_counter()
                in_check = 0.0
                for _ in range(every):
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    if kind == "checked":  # its block's first call checks: once per `every` steps
                        called = time.perf_counter()
                        check_replicas(model, opt, every=every)
                        in_check += time.perf_counter() - called
                pair.append(time.perf_counter() - started)
                if kind == "checked":
                    pair.append(in_check)
            blocks.append(pair)
        took = torch.tensor(blocks, dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # each block's slower rank
        for plain, checked, in_check in took.tolist():
            times["plain"].append(plain / every)
            times["checked"].append(checked / every)
            times["in_check"].append(in_check / every)
    if rank == 0:
        out.put(times)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def ddp_times(steps: int, rounds: int) -> dict[str, list[float]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, steps, rounds, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        times: dict[str, list[float]] = out.get(timeout=900)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--output-ranks", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100, help="DDP steps per round (pairs of 10-step blocks)")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    began = begin()
    print(load_note("before"))
    rows = []
    alike, parted, text = compare_times(args.ranks, args.runs)
    for what, samples in (("all alike", alike), ("one bias differs on the last rank", parted)):
        med = statistics.median(samples)
        rows.append(figure(f"`%dist_compare model`, 10M parameters, {args.ranks} ranks, {what}", samples, "s",
                           target="≤ 1 s", met=med <= 1.0))
        print(f"%dist_compare, {what}: median {med:.3f} s ({min(samples):.3f}-{max(samples):.3f})")
    print(text)
    answer = answer_at(args.output_ranks)
    print(answer)
    rows.append(figure(f"the answer at {args.output_ranks} ranks, two groups: lines", [len(answer.splitlines())],
                       "lines", decimals=0))
    rows.append(figure(f"the answer at {args.output_ranks} ranks, two groups: characters", [len(answer)], "chars",
                       decimals=0))
    rows.append(figure(f"the whole cell's text at {args.ranks} ranks, one bias differing: characters", [len(text)],
                       "chars", decimals=0))
    times = ddp_times(args.steps, args.rounds)
    plain, checked = statistics.median(times["plain"]), statistics.median(times["checked"])
    ratios = [100 * (c - p) / plain for p, c in zip(times["plain"], times["checked"], strict=True)]
    rows.append(figure("a small DDP step (2 ranks, MLP of 85k parameters), plain", [t * 1000 for t in times["plain"]],
                       "ms", decimals=3))
    cost = statistics.median(ratios)
    rows.append(figure("the same step with `check_replicas(model, opt, every=10)`: cost (paired blocks)", ratios,
                       "%", decimals=1, signed=True, median=cost, target="≤ 5%", met=cost <= 5))
    spent = [100 * c / plain for c in times["in_check"]]
    rows.append(figure("time inside `check_replicas(every=10)` per step, against the plain step", spent, "%",
                       decimals=1, target="≤ 5%", met=statistics.median(spent) <= 5))
    print(f"DDP step: plain {plain * 1000:.3f} ms, checked every 10: {checked * 1000:.3f} ms "
          f"(ratio of medians {100 * (checked / plain - 1):+.1f}%, paired {cost:+.1f}%, inside the check "
          f"{statistics.median(spent):.1f}%)")
    print(load_note("after"))
    record("compare", "Comparing replicas: `%dist_compare` and `check_replicas`", rows, began,
           notes=[f"cores: {os.cpu_count()}"])


if __name__ == "__main__":
    main()
