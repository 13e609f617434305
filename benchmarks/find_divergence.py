"""What ``%%collective --find-divergence`` costs a small training step: the step recorded under DebugMode against
the same step plain.

The step: three linear layers (64 wide, ReLU between), a batch of 32, MSE loss, forward, backward and an SGD
step; ``--steps`` (20) of them make one body. Timed in one process, a world of one rank (gloo on loopback), so
the figure is the recording's own cost and the comparison's: "plain" runs the steps, "recorded" runs them inside
``nbdist.diverge.oplog.find_divergence`` (every operation hashed, its cell line looked up, autograd's anomaly
mode on for the forward lines of backward operations, then the comparison's gathers and its answer).
Interleaved, ``--runs`` (15) each after one uncounted run of each. The ratio is reported, with no target.

Run from the repository root::

    .venv/bin/python benchmarks/find_divergence.py [--steps 20] [--runs 15]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

import torch
import torch.distributed as dist
from _common import begin, figure, load_note, record

from nbdist.diverge import oplog


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, data: torch.Tensor, n: int) -> None:
    for _ in range(n):
        loss = torch.nn.functional.mse_loss(model(data), torch.zeros(32, 8))
        opt.zero_grad()
        loss.backward()
        opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    began = begin()
    print(load_note("at start"))
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)  # port 0: a free one
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64)
    plain, recorded, ops = [], [], 0
    try:
        for run in range(args.runs + 1):
            start = time.perf_counter()
            _steps(model, opt, data, args.steps)
            p = time.perf_counter() - start
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), oplog.find_divergence() as log:
                _steps(model, opt, data, args.steps)
            r = time.perf_counter() - start
            ops = len(log)
            if run:
                plain.append(p * 1000)
                recorded.append(r * 1000)
            print(f"run {run}: plain {p * 1000:.1f} ms, recorded {r * 1000:.1f} ms ({ops} operations)")
    finally:
        dist.destroy_process_group()
    ratios = [r / p for r, p in zip(recorded, plain, strict=True)]
    print(f"median: plain {statistics.median(plain):.1f} ms, recorded {statistics.median(recorded):.1f} ms, "
          f"slowdown {statistics.median(ratios):.1f}x")
    print(load_note("at end"))
    record("find_divergence", f"--find-divergence on {args.steps} small training steps (3 linear layers 64 wide, "
                              f"batch 32, SGD; {ops} operations recorded), one process, CPU", [
        figure("the steps, plain", plain, "ms", decimals=1),
        figure("the steps, recorded and compared", recorded, "ms", decimals=1),
        figure("slowdown (recorded / plain, per run)", ratios, "x", decimals=1),
    ], began)


if __name__ == "__main__":
    main()
