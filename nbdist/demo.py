"""The main job: the two-notebook walkthrough, run in N local kernels (``nbdist demo``)."""

from __future__ import annotations

import ast
import sys
import time
from dataclasses import dataclass

from . import kernels, netinfo

# The walkthrough's cells, device-agnostic (DEVICE is set by %%dist_init).
# Each step ends with the value it checks, returned through a user expression.
STEPS: list[tuple[str, str, str]] = [
    (
        "AllReduce",
        """\
tensor = torch.tensor([float(RANK)], device=DEVICE)
print(f"[Rank {RANK}] initial value: {tensor.item()}")
dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
print(f"[Rank {RANK}] AllReduce result: {tensor.item()}")
_nbdist_demo = tensor.item()
""",
        "allreduce",
    ),
    (
        "Broadcast",
        """\
if RANK == 0:
    data = torch.tensor([42.0, 100.0, 256.0], device=DEVICE)
else:
    data = torch.zeros(3, device=DEVICE)
dist.broadcast(data, src=0)
print(f"[Rank {RANK}] after Broadcast: {data.tolist()}")
_nbdist_demo = data.tolist()
""",
        "broadcast",
    ),
    (
        "AllGather",
        """\
local_data = torch.tensor([float(RANK * 10)], device=DEVICE)
gathered = [torch.zeros(1, device=DEVICE) for _ in range(WORLD_SIZE)]
dist.all_gather(gathered, local_data)
result = [t.item() for t in gathered]
print(f"[Rank {RANK}] AllGather result: {result}")
_nbdist_demo = result
""",
        "allgather",
    ),
    (
        "DDP training",
        """\
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1024, 4096)
        self.fc2 = nn.Linear(4096, 1024)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))

torch.manual_seed(0)  # DDP also broadcasts rank 0's initial weights
model = DDP(SimpleModel().to(DEVICE))
torch.manual_seed(1 + RANK)  # each rank trains on its own data
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
criterion = nn.MSELoss()
losses = []
for epoch in range(5):
    data = torch.randn(32, 1024, device=DEVICE)
    target = torch.randn(32, 1024, device=DEVICE)
    loss = criterion(model(data), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    print(f"[Rank {RANK}] Epoch {epoch + 1}/5, Loss: {loss.item():.4f}")
# After DDP's gradient all-reduce, every rank holds the same weights.
checksum = sum(p.detach().double().sum().item() for p in model.parameters())
_nbdist_demo = [len(losses), round(checksum, 6)]
""",
        "ddp",
    ),
]


@dataclass
class Check:
    step: str
    rank: int
    ok: bool
    detail: str


def expectations(world_size: int) -> dict[str, object]:
    return {
        "allreduce": float(sum(range(world_size))),
        "broadcast": [42.0, 100.0, 256.0],
        "allgather": [float(10 * i) for i in range(world_size)],
    }


def _free_port(preferred: int = 29500) -> int:
    """29500 if free, else a free port below the ephemeral range (which other programs' sockets use)."""
    port = netinfo.first_free_port((preferred, *range(29501, 29600), *range(20000, 20100)))
    if port is None:
        raise RuntimeError("no free TCP port on 127.0.0.1")
    return port


def _check(step: str, key: str, rank: int, value: object, expected: dict[str, object], ddp: list) -> Check:
    if key == "ddp":
        epochs, checksum = value  # type: ignore[misc]
        ddp.append(checksum)
        return Check(step, rank, epochs == 5, f"5 epochs, weight checksum {checksum}")
    want = expected[key]
    return Check(step, rank, value == want, f"got {value}, expected {want}")


def run(world_size: int = 2, port: int | None = None, out=sys.stdout, timeout: float = 300) -> int:
    """Run the walkthrough in ``world_size`` kernels; returns 0 only if every expectation holds."""
    port = port or _free_port()
    print(f"nbdist demo: starting {world_size} kernels (one per notebook), rendezvous 127.0.0.1:{port}", file=out)
    started = time.perf_counter()
    ks = kernels.start(world_size)
    checks: list[Check] = []
    try:
        kernels.execute_all(ks, "%load_ext nbdist", timeout=60)
        inits = [
            f"%%dist_init --rank {i} --world-size {world_size} --master-addr 127.0.0.1 --master-port {port}"
            for i in range(world_size)
        ]
        results = kernels.execute_all(ks, inits, timeout=timeout)
        for i, r in enumerate(results):
            if r.status != "ok":
                print(f"rank {i}: %%dist_init failed: {r.error}", file=out)
                return 1
        print(f"world of {world_size} formed in {time.perf_counter() - started:.1f} s\n", file=out)
        expected = expectations(world_size)
        ddp: list[float] = []
        for step, code, key in STEPS:
            # The checked value is also the cell's last expression, so the table shows it as its Out row.
            results = kernels.execute_all(
                ks, "%%collective\n" + code + "_nbdist_demo\n", timeout=timeout, user_expressions={"v": "_nbdist_demo"}
            )
            print(f"=== {step} (as rank 0's notebook shows it) ===", file=out)
            print(results[0].text(), file=out)
            for i, r in enumerate(results):
                if r.status != "ok":
                    checks.append(Check(step, i, False, f"cell failed: {r.error and r.error['evalue']}"))
                    continue
                value = ast.literal_eval(r.expression("v"))
                checks.append(_check(step, key, i, value, expected, ddp))
        if ddp:
            same = len(set(ddp)) == 1
            checks.append(Check("DDP training", -1, same, "weights identical on every rank" if same
                                else f"weights differ between ranks: {ddp}"))
    finally:
        for k in reversed(ks):  # rank 0 hosts the server: stop it last
            k.shutdown()
    print("=== expectations ===", file=out)
    for c in checks:
        who = "all ranks" if c.rank < 0 else f"rank {c.rank}"
        print(f"{'PASS' if c.ok else 'FAIL'}  {c.step:<13} {who:<9} {c.detail}", file=out)
    ok = bool(checks) and all(c.ok for c in checks)
    print(f"\nnbdist demo: {'all expectations hold' if ok else 'FAILED'} "
          f"({time.perf_counter() - started:.1f} s)", file=out)
    return 0 if ok else 1
