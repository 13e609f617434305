"""What comparing replicas costs (issue 48, item 5): ``%dist_compare`` of a 10M-parameter model, the length of its
answer at 16 ranks in two groups, and ``nbdist.check_replicas(every=10)`` against a small DDP step.

1. A driven world of ``--ranks`` (4) ranks (``%dist_init --spawn``), each holding the same 10M-parameter model
   (seeded alike): the client's wall time of ``%dist_compare model``, all alike, and again with one bias differing
   on the last rank (its elements fetched). Target: ≤ 1 s.
2. The answer at ``--output-ranks`` (16) ranks, two groups: the lines every rank prints, from the same decision the
   ranks make (:func:`nbdist.diverge.compare.decide`, no kernels), and the whole cell's text at ``--ranks``.
3. A small DDP training step at 2 ranks (gloo, CPU, processes of this script, each held to a core of its own:
   ranks left to move between the cores spent a third more inside the check), each round in two parts:
   - pairs of blocks of 10 steps, one without and one with ``check_replicas(model, opt, every=10)`` after each
     step (its first call checks), either first in turn, ``--steps / 10`` pairs a round: the median step time of
     each kind, the cost as the median of the paired differences over the plain step's median, and the time spent
     inside ``check_replicas`` (the slower rank's, its collective's wait for the other rank included). A block's
     time varies by ±20% on 2 cores, more than the difference sought: this median moves by points between runs.
   - pairs of blocks of 2 steps, ``--steps / 2`` a round: a step, then a check, then a step, against two steps (and
     every other pair, a bare ``all_gather`` of three numbers a rank in place of the check, for scale). One check's
     cost, with the nine calls that do not check (timed in the first part), over 10 plain steps: the target's
     figure, ≤ 5%. Two steps against two steps differ by less than 0.1%.
   - run as root, a diagnostic: half as many rounds again with the ranks' threads under SCHED_FIFO, where this
     machine's scheduler does not keep a woken thread waiting for its next 4 ms tick (:data:`REALTIME`): the
     plain step, one check's cost and a bare ``all_gather``, no target.

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


EVERY = 10  # check_replicas(model, opt, every=EVERY): the figure


def _ddp_worker(rank: int, size: int, port: int, steps: int, rounds: int, out: object, realtime: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from nbdist.diverge.replicas import check_replicas

    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})  # a core each: the OS moving ranks about is noise
    if realtime:  # this thread and those it starts (gloo's) woken at once: see REALTIME
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 10))
    model = DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    times: dict[str, list[float]] = {"plain": [], "checked": [], "in_check": [], "idle": [], "pair": [],
                                     "bare": [], "pair_plain": []}

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # as the check gathers
    every = EVERY
    for _ in range(rounds):
        dist.barrier()
        blocks = []  # per pair of blocks of `every` steps: plain, checked, inside the check, the calls that did not
        for block in range(steps // every):
            spent = {"in_check": 0.0, "idle": 0.0}
            for kind in (("plain", "checked") if block % 2 else ("checked", "plain")):  # either first, in turn
                started = time.perf_counter()
                for i in range(every):
                    step()
                    if kind == "checked":  # its block's first call checks: once per `every` steps
                        called = time.perf_counter()
                        check_replicas(model, opt, every=every)
                        spent["in_check" if i == 0 else "idle"] += time.perf_counter() - called
                spent[kind] = time.perf_counter() - started
            blocks.append([spent["plain"], spent["checked"], spent["in_check"], spent["idle"] / (every - 1)])
        # Per pair of blocks of 2 steps: plain, and one whose first step is followed by a check (or, every other
        # pair, by a bare collective of the same size)
        pairs = []
        for block in range(steps // 2):
            took = {}
            extra = "checked" if block % 4 < 2 else "gathered"
            for kind in (("plain", extra) if block % 2 else (extra, "plain")):
                started = time.perf_counter()
                step()
                if kind == "checked":
                    check_replicas(net, opt, every=1)  # the same leaves (named without DDP's "module."), own count
                elif kind == "gathered":
                    gather(torch.empty(3 * size, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
                step()
                took[kind] = time.perf_counter() - started
            pairs.append([took["plain"], took[extra], extra == "checked"])
        took_blocks = torch.tensor(blocks, dtype=torch.float64)
        dist.all_reduce(took_blocks, op=dist.ReduceOp.MAX)  # each block's slower rank
        for plain, checked, in_check, idle in took_blocks.tolist():
            times["plain"].append(plain / every)
            times["checked"].append(checked / every)
            times["in_check"].append(in_check / every)
            times["idle"].append(idle)
        took_pairs = torch.tensor(pairs, dtype=torch.float64)
        dist.all_reduce(took_pairs, op=dist.ReduceOp.MAX)
        for plain, other, checked in took_pairs.tolist():
            times["pair_plain"].append(plain / 2)
            times["pair" if checked else "bare"].append(other - plain)
    if rank == 0:
        out.put(times)  # type: ignore[attr-defined]
    dist.destroy_process_group()


# The diagnostic run (``realtime``): the same rounds with the ranks' threads under SCHED_FIFO. On this machine (a VM
# of 2 cores), a thread woken on a core often waits for the next 4 ms scheduler tick: most of a gloo collective's
# time, in a third of them; SCHED_FIFO threads are run at once. Only where this process may set it (root).
REALTIME = hasattr(os, "SCHED_FIFO") and hasattr(os, "geteuid") and os.geteuid() == 0


def ddp_times(steps: int, rounds: int, realtime: bool = False) -> dict[str, list[float]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, steps, rounds, out, realtime)) for r in range(2)]
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
    parser.add_argument("--rounds", type=int, default=42)
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
    rows.append(figure("the same step with `check_replicas(model, opt, every=10)`: cost (paired 10-step blocks)",
                       ratios, "%", decimals=1, signed=True, median=cost))
    spent = [100 * c / plain for c in times["in_check"]]
    rows.append(figure("time inside `check_replicas(every=10)` per step, against the plain step", spent, "%",
                       decimals=1))
    # One check's cost, from many short pairs (a step and a check against a step), spread over `every` steps with the
    # nine calls that do not check: the target's figure, the blocks above being too noisy to hold to 5%
    plain_pair = statistics.median(times["pair_plain"])
    idle = statistics.median(times["idle"])
    per_check = [100 * (d + (EVERY - 1) * idle) / (EVERY * plain_pair) for d in times["pair"]]
    amortised = statistics.median(per_check)
    rows.append(figure("`check_replicas(every=10)`: one check's cost (paired 2-step blocks) and nine calls that do "
                       "not check, over 10 plain steps", per_check, "%", decimals=1, signed=True, median=amortised,
                       target="≤ 5%", met=amortised <= 5))
    bare = [100 * d / (EVERY * plain_pair) for d in times["bare"]]
    rows.append(figure("for scale: a bare `all_gather` of 3 numbers a rank (the check's collective alone), paired "
                       "2-step blocks, over 10 plain steps", bare, "%", decimals=1, signed=True))
    print(f"DDP step: plain {plain * 1000:.3f} ms, checked every 10: {checked * 1000:.3f} ms "
          f"(ratio of medians {100 * (checked / plain - 1):+.1f}%, paired blocks {cost:+.1f}%, inside the check "
          f"{statistics.median(spent):.1f}%); one check {statistics.median(times['pair']) * 1000:.3f} ms against a "
          f"step of {plain_pair * 1000:.3f} ms, a call that does not check {idle * 1e6:.1f} us: {amortised:+.1f}%; "
          f"a bare all_gather {statistics.median(times['bare']) * 1000:.3f} ms")
    if REALTIME:
        rt = ddp_times(args.steps, max(1, args.rounds // 2), realtime=True)
        rt_step, rt_idle = statistics.median(rt["pair_plain"]), statistics.median(rt["idle"])
        rows.append(figure("diagnostic, ranks under SCHED_FIFO (no 4 ms waits for a tick): the plain step",
                           [t * 1000 for t in rt["pair_plain"]], "ms", decimals=3))
        rt_check = [100 * (d + (EVERY - 1) * rt_idle) / (EVERY * rt_step) for d in rt["pair"]]
        rows.append(figure("diagnostic, SCHED_FIFO: one check's cost and nine calls that do not check, over 10 "
                           "plain steps", rt_check, "%", decimals=1, signed=True))
        rows.append(figure("diagnostic, SCHED_FIFO: a bare `all_gather` of 3 numbers a rank, over 10 plain steps",
                           [100 * d / (EVERY * rt_step) for d in rt["bare"]], "%", decimals=1, signed=True))
        one, gather = statistics.median(rt["pair"]), statistics.median(rt["bare"])
        print(f"under SCHED_FIFO: a step of {rt_step * 1000:.3f} ms, one check {one * 1000:.3f} ms: "
              f"{statistics.median(rt_check):+.1f}%; a bare all_gather {gather * 1000:.3f} ms")
    else:
        print("the diagnostic under SCHED_FIFO is left out: setting it needs root")
    print(load_note("after"))
    record("compare", "Comparing replicas: `%dist_compare` and `check_replicas`", rows, began,
           notes=[f"cores: {os.cpu_count()}"])


if __name__ == "__main__":
    main()
