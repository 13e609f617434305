"""The course's content: one lesson per notebook, as markdown and code cells (make_course.py writes them).

Every cell that a rank must run is a ``%%collective`` cell, so that each lesson runs both ways: as one
notebook per rank (``SPAWN = 0``, or ``nbdist run --world-size N``), and as one notebook that drives
local worker kernels (``SPAWN = N``, or ``nbdist run --spawn``), whose workers run only ``%%collective``
cells. The ``assert`` cells hold for any world size of 2 or more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbdist.demo import SEED_MODEL  # the seed walkthrough's model, as nbdist demo trains it


@dataclass
class Cell:
    kind: str  # "markdown" or "code"
    id: str
    source: str
    tags: list[str] = field(default_factory=list)


def md(id: str, text: str) -> Cell:
    return Cell("markdown", id, text.strip("\n"))


def code(id: str, source: str, *tags: str) -> Cell:
    return Cell("code", id, source.strip("\n"), list(tags))


@dataclass
class Lesson:
    name: str  # the notebook's file name, without .ipynb
    title: str
    intro: str
    cells: list[Cell]


HOW_TO_RUN = """\
**How to run it.** As it stands, this notebook drives the whole world: `SPAWN = 2` below makes it rank 0
and starts rank 1 as a local worker kernel that follows it (set `SPAWN = 4` for four ranks). For one
notebook per rank, as on two machines, set `SPAWN = 0`, copy the notebook, and give each copy its own
`RANK` (and `MASTER_ADDR`, rank 0's address). Headless, as CI runs it:
`nbdist run {name}.ipynb --world-size 4` (one copy per rank) or `nbdist run {name}.ipynb --spawn
--world-size 4`.

**The pictures.** `nbdist.show(tensor, label)` draws a tensor as a grid of its values, each coloured by the
rank it came from, in the rank's column of the table. The convention: a value `v` with
`0 <= v < 100 * WORLD_SIZE` that is a whole number belongs to rank `v // 100`, so the lessons build
their tensors as `100 * RANK + i`. Grey values belong to no single rank (a sum, say). The colours are
the Okabe–Ito palette, readable with the common kinds of colour blindness, and the legend under each
picture names the ranks, so colour is never the only clue. Rows identical on every rank are shown
once, marked *identical*; rows that differ are marked *differs*.

The cells use `DEVICE`, this rank's `torch.device`, so they run unchanged on CPU (gloo), GPUs (NCCL)
and Ascend NPUs (HCCL, with `torch_npu`)."""

PARAMETERS = """\
# Parameters: `nbdist run` sets these for each copy it runs.
SPAWN = 2                  # this notebook drives SPAWN ranks (local worker kernels); 0: one notebook per rank
RANK = 0                   # with SPAWN = 0: this notebook's rank (0 in the first notebook, 1 in the next...)
WORLD_SIZE = 2             # with SPAWN = 0: the number of notebooks
MASTER_ADDR = "127.0.0.1"  # with SPAWN = 0: rank 0's address
MASTER_PORT = 29500"""

# What each backend lacks, in the course's own words; the setup cell of each lesson defines it on every rank.
# Facts and sources: examples/course/README.md ("Where the backends differ").
MISSING = '''\
TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
MISSING = {  # backend -> what it lacks -> why (examples/course/README.md gives the sources)
    "gloo": {} if TORCH >= (2, 7) else {
        "AVG": "gloo has ReduceOp.AVG only from torch 2.7",
        "reduce_scatter": "gloo has reduce_scatter only from torch 2.7",
    },
    "nccl": {
        "BAND": "NCCL has no bitwise reductions (ProcessGroupNCCL refuses BAND, BOR and BXOR)",
        "BOR": "NCCL has no bitwise reductions",
        "BXOR": "NCCL has no bitwise reductions",
    },
    "hccl": {
        "BAND": "HCCL has no bitwise reductions (torch_npu's ProcessGroupHCCL refuses BAND, BOR and BXOR)",
        "BOR": "HCCL has no bitwise reductions",
        "BXOR": "HCCL has no bitwise reductions",
    },
}


def lacks(what):
    """Whether this world's backend lacks `what`; if so, say so on this rank and skip it."""
    why = MISSING.get(backend, {}).get(what)
    if why:
        print(f"{what}: skipped on {backend}: {why}")
    return why is not None'''

SETUP = f"""\
%%collective
import nbdist

backend = dist.get_backend()
{MISSING}


assert WORLD_SIZE >= 2, "the lessons need at least 2 ranks"
print(f"rank {{RANK}} of {{WORLD_SIZE}} · backend {{backend}} · device {{DEVICE}}")"""


def head(name: str) -> list[Cell]:
    return [
        code("load-ext", "%load_ext nbdist"),
        md("parameters-intro", HOW_TO_RUN.format(name=name)),
        code("parameters", PARAMETERS, "parameters"),
        md("init-intro", """\
## Join the world

`%%dist_init` reads the parameters above. With `SPAWN`, it starts the worker kernels and shows them
joining; otherwise it waits until every notebook has run it. Afterwards `torch`, `dist`
(`torch.distributed`), `RANK`, `WORLD_SIZE` and `DEVICE` are defined on every rank. The next cell defines,
on every rank, `nbdist` and what this world's backend lacks."""),
        code("dist-init", "%%dist_init\n# joins with the parameters above"),
        code("setup", SETUP),
    ]


TAIL = [
    md("end-intro", """\
## Leaving

`%dist_barrier` waits until every rank got here, so that no notebook leaves while another still needs
the world; `%dist_destroy` leaves it (and stops the worker kernels, if this notebook started them)."""),
    code("barrier", "%dist_barrier"),
    code("destroy", "%dist_destroy"),
]


POINT_TO_POINT = Lesson("1_point_to_point", "Point to point: send, recv, and a ring", """\
Two ranks talk directly: one sends a tensor, the other receives it into a tensor of the same shape and
dtype. Every collective in the next lesson can be built from such messages, and the ring at the end of
this lesson is how NCCL and HCCL move data inside an all_gather.""", [
    md("send-intro", """\
## `send` and `recv`

`dist.send(t, dst=1)` on rank 0 and `dist.recv(t, src=0)` on rank 1 move rank 0's values into rank 1's
tensor; both calls return once the message is through. The other ranks take no part. nbdist checks
collectives across ranks before they run, but not point-to-point calls: only the two ranks involved
know of them. **Expect:** after the call, rank 1 holds `0 1 2 3` in rank 0's colour; every other
rank keeps its own values."""),
    code("send", """\
%%collective
t = torch.arange(4.0, device=DEVICE) + 100 * RANK
nbdist.show(t, "before")
if RANK == 0:
    dist.send(t, dst=1)
elif RANK == 1:
    dist.recv(t, src=0)
nbdist.show(t, "after")"""),
    code("send-check", """\
%%collective
owner = 0 if RANK == 1 else RANK
assert t.cpu().tolist() == [100.0 * owner + i for i in range(4)], t
"send/recv: ok" """),
    md("isend-intro", """\
## `isend` and `irecv`

The non-blocking forms return at once with a request; `request.wait()` waits for it. Here ranks 0 and
1 swap tensors at the same time. With blocking calls both ranks would have to agree who sends first,
or each could wait for the other for ever. **Expect:** rank 0 receives rank 1's values and rank 1
receives rank 0's; ranks 2 and above take no part."""),
    code("isend", """\
%%collective
mine = torch.arange(4.0, device=DEVICE) + 100 * RANK
theirs = torch.zeros(4, device=DEVICE)
if RANK in (0, 1):
    peer = 1 - RANK
    requests = [dist.isend(mine, dst=peer), dist.irecv(theirs, src=peer)]
    for request in requests:
        request.wait()
    nbdist.show(theirs, f"received from rank {peer}")
else:
    print("not in this exchange")"""),
    code("isend-check", """\
%%collective
if RANK in (0, 1):
    assert theirs.cpu().tolist() == [100.0 * (1 - RANK) + i for i in range(4)], theirs
"isend/irecv: ok" """),
    md("ring-intro", """\
## A ring pass

Each rank sends to its right neighbour, `(RANK + 1) % WORLD_SIZE`, and receives from its left one, all
at once; then it passes on what it received. After `WORLD_SIZE - 1` steps every rank has seen every
rank's chunk: this is a ring all_gather, the algorithm NCCL and HCCL use for large messages, done by
hand. **Expect:** row `k` of each rank's picture came from the rank `k` places to its left, so the colours
run through the ranks in a different order on each rank."""),
    code("ring", """\
%%collective
right, left = (RANK + 1) % WORLD_SIZE, (RANK - 1) % WORLD_SIZE
send = torch.arange(2.0, device=DEVICE) + 100 * RANK
seen = [send]
for step in range(WORLD_SIZE - 1):
    recv = torch.zeros_like(send)
    requests = [dist.isend(send, dst=right), dist.irecv(recv, src=left)]
    for request in requests:
        request.wait()
    seen.append(recv)
    send = recv
nbdist.show(torch.stack(seen), "what this rank saw, one row per step")"""),
    code("ring-check", """\
%%collective
for k, row in enumerate(seen):
    source = (RANK - k) % WORLD_SIZE
    assert row.cpu().tolist() == [100.0 * source, 100.0 * source + 1], (k, row)
assert sorted(int(row[0]) // 100 for row in seen) == list(range(WORLD_SIZE))
"ring: every rank saw every rank's chunk" """),
])


COLLECTIVES = Lesson("2_collectives", "The collectives, one by one", """\
A collective is a call that every rank of a group makes; together they move or combine data. Each
section explains one, draws every rank's tensor before and after, and checks the result for any
world size.""", [
    md("broadcast-intro", """\
## `broadcast`

`dist.broadcast(t, src=0)` copies rank 0's tensor into the same tensor on every rank. Use it to start
every rank from the same weights or the same random seed. **Expect:** after the call every rank holds
`0 1 2 3` in rank 0's colour, shown once as *identical on all ranks*."""),
    code("broadcast", """\
%%collective
t = torch.arange(4.0, device=DEVICE) + 100 * RANK
nbdist.show(t, "before")
dist.broadcast(t, src=0)
nbdist.show(t, "after broadcast from rank 0")"""),
    code("broadcast-check", """\
%%collective
assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0], t
"broadcast: ok" """),
    md("reduce-intro", """\
## `reduce`

`dist.reduce(t, dst=0)` combines every rank's tensor, element by element (a sum by default), into rank
0's tensor. The other ranks' tensors are not defined afterwards: backends may use them as scratch space.
**Expect:** on rank 0, element `i` is the sum over the ranks of `100 * rank + i`, grey because every rank
contributed to it."""),
    code("reduce", """\
%%collective
t = torch.arange(4.0, device=DEVICE) + 100 * RANK
nbdist.show(t, "before")
dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
if RANK == 0:
    nbdist.show(t, "after reduce to rank 0", owner=False)
else:
    print("after: not defined on this rank (only rank 0 receives the result)")"""),
    code("reduce-check", """\
%%collective
if RANK == 0:
    assert t.cpu().tolist() == [sum(100.0 * r + i for r in range(WORLD_SIZE)) for i in range(4)], t
"reduce: ok" """),
    md("all-reduce-intro", """\
## `all_reduce`, with every reduce operation

`dist.all_reduce(t, op)` is a reduce whose result every rank receives; DDP averages gradients with it.
The cell runs every `ReduceOp`, one line each: `SUM`, `PRODUCT`, `MIN` and `MAX`, and `AVG`, on
`[RANK + 1, 10 - RANK]` in float32; the bitwise `BAND`, `BOR` and `BXOR` on `[1 << RANK, 6 + RANK]` in
int64. **Where backends differ:** NCCL and HCCL have no bitwise operations: a line says so and the
operation is skipped. gloo has `AVG` from torch 2.7 (a sum, then a division: so not for integer
tensors); HCCL computes `AVG` the same way; NCCL has it natively. `PREMUL_SUM` (a sum with a factor
applied first) is NCCL's, and recent torch_npu's, and is left out.
**Expect:** the same line for each operation on every rank, so the rows are *identical*."""),
    code("all-reduce", """\
%%collective
def contribution(name, rank):
    if name in ("BAND", "BOR", "BXOR"):
        return [1 << rank, 6 + rank]
    return [rank + 1.0, 10.0 - rank]


t = torch.arange(4.0, device=DEVICE) + 100 * RANK
nbdist.show(t, "before")
dist.all_reduce(t, op=dist.ReduceOp.SUM)
nbdist.show(t, "after all_reduce(SUM)", owner=False)
results = {}
for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
    if lacks(name):
        continue
    x = torch.tensor(contribution(name, RANK), device=DEVICE)
    dist.all_reduce(x, op=getattr(dist.ReduceOp, name))
    results[name] = x.cpu().tolist()
    print(f"{name:8} {results[name]}")"""),
    code("all-reduce-check", """\
%%collective
import functools
import operator

combine = {"SUM": operator.add, "PRODUCT": operator.mul, "MIN": min, "MAX": max,
           "BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}
assert t.cpu().tolist() == [sum(100.0 * r + i for r in range(WORLD_SIZE)) for i in range(4)], t
for name, got in results.items():
    columns = zip(*(contribution(name, r) for r in range(WORLD_SIZE)))
    if name == "AVG":
        want = [sum(c) / WORLD_SIZE for c in columns]
    else:
        want = [functools.reduce(combine[name], c) for c in columns]
    assert got == want, (name, got, want)
f"all_reduce: {len(results)} operations ok" """),
    md("gather-intro", """\
## `gather`

`dist.gather(t, gather_list, dst=0)` collects every rank's tensor into a list on rank 0 only. **Where
backends differ:** PyTorch's NCCL backend builds gather and scatter from point-to-point messages (they
came late, in torch 1.11); torch_npu's HCCL backend has no gather of its own and runs an all_gather
instead, so every rank receives the whole result (it warns once). **Expect:** on rank 0, row `r` is
rank `r`'s tensor, in rank `r`'s colour."""),
    code("gather", """\
%%collective
t = torch.arange(2.0, device=DEVICE) + 100 * RANK
nbdist.show(t, "before")
gathered = [torch.zeros(2, device=DEVICE) for _ in range(WORLD_SIZE)] if RANK == 0 else None
dist.gather(t, gathered, dst=0)
if RANK == 0:
    nbdist.show(torch.stack(gathered), "after gather to rank 0: row r from rank r")"""),
    code("gather-check", """\
%%collective
if RANK == 0:
    assert [g.cpu().tolist() for g in gathered] == [[100.0 * r, 100.0 * r + 1] for r in range(WORLD_SIZE)]
"gather: ok" """),
    md("scatter-intro", """\
## `scatter`

The reverse of gather: `dist.scatter(t, scatter_list, src=0)` gives rank `r` the `r`-th tensor of rank
0's list. Rank 0's data is in rank 0's colour; the row each rank receives keeps that colour, since it
came from rank 0. **Expect:** rank `r` ends with `10 * r, 10 * r + 1`."""),
    code("scatter", """\
%%collective
chunks = [torch.arange(2.0, device=DEVICE) + 10 * r for r in range(WORLD_SIZE)] if RANK == 0 else None
if RANK == 0:
    nbdist.show(torch.stack(chunks), "before, on rank 0: row r goes to rank r")
t = torch.zeros(2, device=DEVICE)
dist.scatter(t, chunks, src=0)
nbdist.show(t, "after scatter from rank 0")"""),
    code("scatter-check", """\
%%collective
assert t.cpu().tolist() == [10.0 * RANK, 10.0 * RANK + 1], t
"scatter: ok" """),
    md("all-gather-intro", """\
## `all_gather`

A gather whose result every rank receives. Tensor parallelism and ZeRO/FSDP use it to reassemble
parameters that are split over the ranks. **Expect:** every rank holds the same picture, one row per
rank in that rank's colour, shown once as *identical*."""),
    code("all-gather", """\
%%collective
t = torch.arange(2.0, device=DEVICE) + 100 * RANK
nbdist.show(t, "before")
gathered = [torch.zeros(2, device=DEVICE) for _ in range(WORLD_SIZE)]
dist.all_gather(gathered, t)
nbdist.show(torch.stack(gathered), "after all_gather: row r from rank r")"""),
    code("all-gather-check", """\
%%collective
assert [g.cpu().tolist() for g in gathered] == [[100.0 * r, 100.0 * r + 1] for r in range(WORLD_SIZE)]
"all_gather: ok" """),
    md("reduce-scatter-intro", """\
## `reduce_scatter`

Each rank holds `WORLD_SIZE` chunks; chunk `r` of every rank is summed, and rank `r` receives that sum.
It is half of an all_reduce (the other half is an all_gather), and ZeRO/FSDP use it to give each rank
the sum of only its share of the gradients. **Expect:** rank `r` receives the sum of every rank's
chunk `r`, grey because every rank contributed."""),
    code("reduce-scatter", """\
%%collective
t = torch.arange(2.0 * WORLD_SIZE, device=DEVICE) + 100 * RANK
nbdist.show(t.view(WORLD_SIZE, 2), "before: row r goes, summed, to rank r")
mine = torch.zeros(2, device=DEVICE)
if not lacks("reduce_scatter"):
    dist.reduce_scatter(mine, list(t.chunk(WORLD_SIZE)))
    nbdist.show(mine, "after reduce_scatter", owner=False)"""),
    code("reduce-scatter-check", """\
%%collective
want = [sum(100.0 * r + 2 * RANK + i for r in range(WORLD_SIZE)) for i in range(2)]
assert lacks("reduce_scatter") or mine.cpu().tolist() == want, (mine, want)
"reduce_scatter: ok" """),
    md("all-to-all-intro", """\
## `all_to_all`

Every rank sends its chunk `j` to rank `j`, and receives chunk `RANK` of every rank: a transpose across
the ranks, as mixture-of-experts layers use to send tokens to their experts. **Expect:** element `j` of
each rank's result came from rank `j`, so every result runs through all the colours."""),
    code("all-to-all", """\
%%collective
t = torch.arange(float(WORLD_SIZE), device=DEVICE) + 100 * RANK
nbdist.show(t, "before: element j goes to rank j")
received = torch.zeros(WORLD_SIZE, device=DEVICE)
dist.all_to_all_single(received, t)
nbdist.show(received, "after all_to_all: element j from rank j")"""),
    code("all-to-all-check", """\
%%collective
assert received.cpu().tolist() == [100.0 * j + RANK for j in range(WORLD_SIZE)], received
"all_to_all: ok" """),
    md("barrier-intro", """\
## `barrier`

`dist.barrier()` returns on every rank once every rank has called it. Here rank `r` first sleeps
`0.2 * r` seconds. **Expect:** every rank leaves the barrier when the last one arrives, about
`0.2 * (WORLD_SIZE - 1)` seconds after the cell began."""),
    code("barrier-demo", """\
%%collective
import time

start = time.perf_counter()
time.sleep(0.2 * RANK)
dist.barrier()
waited = time.perf_counter() - start
print(f"left the barrier after {waited:.1f} s")"""),
    code("barrier-check", """\
%%collective
assert waited >= 0.2 * (WORLD_SIZE - 1) - 0.05, waited
"barrier: ok" """),
])


DDP = Lesson("3_ddp", "DistributedDataParallel: the same gradients, the same weights", """\
`DistributedDataParallel` (DDP) keeps one copy of the model on every rank. Each rank computes the loss
on its own data; during `backward()` DDP all-reduces the gradients and divides them by the world size,
so every rank holds the same averaged gradient, the optimiser takes the same step everywhere, and the
weights stay identical. The model is the seed walkthrough's: two linear layers, 8.4 million
parameters.""", [
    md("model-intro", """\
## The model on every rank

DDP broadcasts rank 0's initial weights when it wraps the model, so every rank starts alike even
though each seeds its own data differently. **Expect:** the weight checksum is *identical on all
ranks*."""),
    code("model", "%%collective\n" + SEED_MODEL + """

def checksum(tensors):
    return round(sum(t.detach().double().sum().item() for t in tensors), 6)


torch.manual_seed(RANK)  # different on every rank: DDP's broadcast is what makes them equal
model = DDP(SimpleModel().to(DEVICE))
torch.manual_seed(1 + RANK)  # each rank trains on its own data
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
criterion = nn.MSELoss()
print(f"weights: checksum {checksum(model.parameters())}")"""),
    md("grads-intro", """\
## Gradients: each rank's own, then averaged

First the gradient of this rank's loss alone, taken with `torch.autograd.grad` through `model.module`,
the model inside DDP, so DDP takes no part: each rank's gradient is its own, and the pictures *differ*.
Then the same data through the DDP model and a normal `backward()`: the gradients are averaged over
the ranks, and the pictures are *identical*. The values are grey: an average belongs to no single
rank."""),
    code("grads", """\
%%collective
data = torch.randn(32, 1024, device=DEVICE)
target = torch.randn(32, 1024, device=DEVICE)
(grad,) = torch.autograd.grad(criterion(model.module(data), target), model.module.fc2.bias)
own = grad[:6].clone()
nbdist.show(own, "fc2.bias.grad[:6], this rank's own", owner=False)

optimizer.zero_grad()
loss = criterion(model(data), target)
loss.backward()
averaged = model.module.fc2.bias.grad[:6].clone()
nbdist.show(averaged, "fc2.bias.grad[:6] after backward(): averaged over the ranks", owner=False)
print(f"loss on this rank's data: {loss.item():.4f}")
print(f"gradient checksum: {checksum(p.grad for p in model.parameters())}")"""),
    code("grads-check", """\
%%collective
owns = [None] * WORLD_SIZE
dist.all_gather_object(owns, own.cpu())
assert torch.allclose(averaged.cpu(), sum(owns) / WORLD_SIZE, atol=1e-6), (averaged, owns)
grads = [None] * WORLD_SIZE
dist.all_gather_object(grads, checksum(p.grad for p in model.parameters()))
assert len(set(grads)) == 1, grads
"gradients: the average of every rank's own, identical on every rank" """),
    md("steps-intro", """\
## Training steps

Three steps, each on fresh data of each rank's own. **Expect:** the losses *differ* between the ranks
(each has its own data), while the weight checksum after each step is *identical*."""),
    code("steps", """\
%%collective
for step in range(3):
    data = torch.randn(32, 1024, device=DEVICE)
    target = torch.randn(32, 1024, device=DEVICE)
    optimizer.zero_grad()
    loss = criterion(model(data), target)
    loss.backward()
    optimizer.step()
    print(f"step {step + 1}: loss {loss.item():.4f} on this rank's data")
print(f"weights after 3 steps: checksum {checksum(model.parameters())}")"""),
    code("steps-check", """\
%%collective
# Every rank's weights, gathered and compared element by element: DDP keeps the replicas equal, bit for bit.
mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(mine) for _ in range(WORLD_SIZE)]
dist.all_gather(everyone, mine)
assert all(torch.equal(w, everyone[0]) for w in everyone), [checksum([w]) for w in everyone]
"weights: the same on every rank after every step, bit for bit" """),
])


# After each deliberate failure: the next cell works on every rank.
STILL_WORKS = """\
%%collective
t = torch.ones(1, device=DEVICE)
dist.all_reduce(t)
assert t.item() == WORLD_SIZE
"the world still works" """

DEBUGGING = Lesson("4_debugging", "Debugging: what goes wrong, and what nbdist shows", """\
By hand, a mistake in one rank's cell usually hangs every other rank without a word. This lesson makes
four such mistakes on purpose and shows what nbdist says instead, in every notebook. The failing cells
are tagged `raises-exception`, so that *Run All* and `nbdist run` carry on past them; after each, a cell
shows that the world still works.""", [
    md("mismatch-intro", """\
## A shape mismatch

Rank `r` all-reduces a tensor of `2 + r` elements. By hand, gloo would hang or fail with a message about
sizes; NCCL and HCCL can hang, or corrupt memory. nbdist compares every collective across the ranks
before it runs. **Expect:** `CollectiveMismatchError` on every rank, naming the collective and each
rank's shape; nothing is sent."""),
    code("mismatch", """\
%%collective
t = torch.zeros(2 + RANK, device=DEVICE)
dist.all_reduce(t)""", "raises-exception"),
    code("after-mismatch", STILL_WORKS),
    md("raises-intro", """\
## A rank that raises

Rank 1 raises before its `all_reduce`, while the others already wait inside theirs. **Expect:** rank 1's
`ValueError` in its column, with its traceback; the others' cells end at once with `PeerFailedError`
naming rank 1, instead of waiting for the process group's timeout."""),
    code("raises", """\
%%collective
t = torch.ones(1, device=DEVICE)
if RANK == 1:
    raise ValueError("rank 1 found a bad batch")
dist.all_reduce(t)""", "raises-exception"),
    code("after-raises", STILL_WORKS),
    md("never-intro", """\
## A rank that never arrives

Rank 0 calls `all_reduce`; the others never do (say, an `if` that differs between the ranks). By hand,
rank 0 waits until the process group's timeout, minutes later, and then the error names no rank.
**Expect:** when the others finish the cell, `CollectiveMismatchError` on every rank: they finished
after 0 collectives, while rank 0 issued #1 (all_reduce)."""),
    code("never", """\
%%collective
t = torch.ones(1, device=DEVICE)
if RANK == 0:
    dist.all_reduce(t)""", "raises-exception"),
    code("after-never", STILL_WORKS),
    md("stop-intro", """\
## The stop button

A loop that never ends. In a notebook, press the stop button (■) in any rank's notebook (in the driving
notebook, when it drives): that cell gets `KeyboardInterrupt`, and every other rank's cell ends at once,
naming the rank that stopped. Here `--max-time 3` presses it for you after 3 seconds, so the lesson also
runs headless. **Expect:** `MaxTimeError` on every rank after about 3 seconds."""),
    code("stop", """\
%%collective --max-time 3
t = torch.ones(1, device=DEVICE)
while True:
    dist.all_reduce(t)""", "raises-exception"),
    code("after-stop", STILL_WORKS),
])


LESSONS = [POINT_TO_POINT, COLLECTIVES, DDP, DEBUGGING]
