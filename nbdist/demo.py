"""The main job: the two-notebook walkthrough, driven from one notebook kernel (``nbdist demo``).

The kernel runs ``%dist_init --spawn N``, as a person in one notebook would:
nbdist starts the other ranks as worker kernels that follow it, and each step
is a ``%%collective`` cell of that one kernel. Each rank's checked value is
gathered to rank 0 at the end, by one more cell.
"""

from __future__ import annotations

import ast
import functools
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from .drive import kernels

# The seed walkthrough's model (two linear layers, about 8.4 million parameters); the course's DDP lesson uses it.
SEED_MODEL = """\
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
"""

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
        SEED_MODEL + """\

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
# After DDP's gradient all-reduce, every rank holds the same weights, bit for bit:
# gather every rank's weights and compare them element by element.
weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(weights) for _ in range(WORLD_SIZE)]
dist.all_gather(everyone, weights)
identical = all(torch.equal(w, everyone[0]) for w in everyone)
checksum = sum(p.detach().double().sum().item() for p in model.parameters())
_nbdist_demo = [len(losses), checksum, identical]
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


def _check(step: str, key: str, rank: int, value: Any, expected: dict[str, object], ddp: list[float]) -> Check:
    if key == "ddp":
        epochs, checksum, identical = value  # a rank's (epochs, checksum, identical), read from its kernel
        ddp.append(checksum)
        torch_says = expected.get("ddp")
        same = checksum == torch_says
        return Check(step, rank, epochs == 5 and bool(identical) and (torch_says is None or same),
                     f"5 epochs, weight checksum {checksum!r}"
                     + ("" if torch_says is None else " (plain torch: the same)" if same
                        else f", plain torch gives {torch_says!r}")
                     + ("; every rank's weights equal, element by element" if identical
                        else "; the ranks' weights DIFFER (torch.equal on the gathered weights)"))
    want = expected[key]
    return Check(step, rank, value == want, f"got {value}, expected {want}")


class _Reference:
    """:func:`plain_torch_checksum` in a thread of its own, so that it runs while the world forms."""

    def __init__(self, world_size: int) -> None:
        self._box: dict[str, object] = {}
        self._thread = threading.Thread(target=self._run, args=(world_size,), name="nbdist-demo-reference",
                                        daemon=True)
        self._thread.start()

    def _run(self, world_size: int) -> None:
        try:
            self._box["value"] = plain_torch_checksum(world_size)
        except Exception as exc:  # reported by result()
            self._box["error"] = exc

    def result(self, timeout: float) -> float:
        self._thread.join(timeout)
        if "error" in self._box:
            raise self._box["error"]  # type: ignore[misc]
        if "value" not in self._box:
            raise TimeoutError(f"the plain torch run took over {timeout:g} s")
        return self._box["value"]  # type: ignore[return-value]


@functools.cache
def plain_torch_checksum(world_size: int) -> float:
    """The DDP training's weight checksum as plain torch computes it here (gloo, no nbdist)."""
    from .measure import plain_torch

    code = next(code for _, code, key in STEPS if key == "ddp")
    values = plain_torch.run(code, world_size, ("_nbdist_demo",))
    checksums: set[float] = {v["_nbdist_demo"][1] for v in values}
    if len(checksums) != 1 or not all(v["_nbdist_demo"][2] for v in values):
        raise RuntimeError(f"plain torch's own DDP replicas differ here: {values}")
    return checksums.pop()


GATHER = """\
%%collective
_nbdist_all = [None] * WORLD_SIZE
dist.all_gather_object(_nbdist_all, _nbdist_values)
"""


def run(world_size: int = 2, port: int | None = None, out: TextIO = sys.stdout, timeout: float = 300) -> int:
    """Run the walkthrough from one kernel with ``world_size`` ranks; returns 0 only if every expectation holds."""
    where = f"--master-port {port}" if port else "port 29500, or a free one"
    print(f"nbdist demo: one notebook kernel runs %dist_init --spawn {world_size} ({where}): it starts "
          f"{world_size - 1} worker kernel(s) that follow it", file=out)
    started = time.perf_counter()
    reference = _Reference(world_size)  # plain torch's DDP weights, computed beside the world
    (k,) = kernels.start(1)
    checks: list[Check] = []
    try:
        k.execute("%load_ext nbdist", timeout=60)
        init = k.execute(f"%dist_init --spawn {world_size}" + (f" --master-port {port}" if port else ""),
                         timeout=timeout, user_expressions={"p": "__import__('os').environ.get('MASTER_PORT')"})
        if init.status != "ok":
            print(f"%dist_init --spawn failed: {init.error and init.error['evalue']}", file=out)
            return 1
        print(f"world of {world_size} formed in {time.perf_counter() - started:.1f} s, rendezvous "
              f"127.0.0.1:{ast.literal_eval(init.expression('p'))}\n", file=out)
        checks = walk(k, world_size, out, timeout, reference)
    finally:
        k.shutdown()  # its workers stop with it
    print("=== expectations ===", file=out)
    for c in checks:
        who = "all ranks" if c.rank < 0 else f"rank {c.rank}"
        print(f"{'PASS' if c.ok else 'FAIL'}  {c.step:<13} {who:<9} {c.detail}", file=out)
    ok = bool(checks) and all(c.ok for c in checks)
    print(f"\nnbdist demo: {'all expectations hold' if ok else 'FAILED'} "
          f"({time.perf_counter() - started:.1f} s)", file=out)
    return 0 if ok else 1


def walk(k: kernels.Kernel, world_size: int, out: TextIO = sys.stdout, timeout: float = 300,
         reference: _Reference | None = None) -> list[Check]:
    """Run the walkthrough's cells in ``k``, a joined kernel that drives (or runs in lockstep with) the others;
    returns every rank's checks, DDP's weights against plain torch's where ``reference`` computes them."""
    checks: list[Check] = []
    for step, code, key in STEPS:
        # The checked value is also the cell's last expression, so the table shows it as its Out row.
        cell = f"%%collective\n{code}globals().setdefault('_nbdist_values', {{}})[{key!r}] = _nbdist_demo\n" \
               "_nbdist_demo\n"
        result = k.execute(cell, timeout=timeout)
        print(f"=== {step} (as the notebook shows it) ===", file=out)
        print(result.text(), file=out)
        if result.status != "ok":
            checks.append(Check(step, -1, False, f"cell failed: {result.error and result.error['evalue']}"))
    gathered = k.execute(GATHER, timeout=timeout, user_expressions={"v": "_nbdist_all"})
    if gathered.status != "ok":
        checks.append(Check("gather", -1, False, f"cell failed: {gathered.error and gathered.error['evalue']}"))
        return checks
    torch_says = None
    if reference is not None:
        print("=== the same DDP training in plain torch (gloo, no nbdist), to compare ===", file=out)
        torch_says = reference.result(timeout)
        print(f"plain torch: weight checksum {torch_says!r}\n", file=out)
    return checks + _checks(ast.literal_eval(gathered.expression("v")), world_size, torch_says)


def _checks(values: list[dict[str, object]], world_size: int, ddp_checksum: float | None = None) -> list[Check]:
    """Every rank's values against the walkthrough's expectations (and DDP's weights alike on all ranks, and
    equal to ``ddp_checksum``, plain torch's, if given)."""
    expected: dict[str, object] = {**expectations(world_size), "ddp": ddp_checksum}
    checks: list[Check] = []
    ddp: list[float] = []
    for step, _, key in STEPS:
        for rank, mine in enumerate(values):
            if key not in (mine or {}):
                checks.append(Check(step, rank, False, "no value: the cell did not finish on this rank"))
                continue
            checks.append(_check(step, key, rank, mine[key], expected, ddp))
    if ddp:
        same = len(set(ddp)) == 1
        checks.append(Check("DDP training", -1, same, "weights identical on every rank" if same
                            else f"weights differ between ranks: {ddp}"))
    return checks
