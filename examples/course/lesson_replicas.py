"""The fifth lesson, "When replicas differ": three classic ways the ranks' models part, each shown, found with
nbdist's tools (``%dist_compare``, ``%%collective --find-divergence``, ``nbdist.check_replicas``) and fixed.

A module of its own beside lessons.py (whose helpers it uses), so that neither grows past the house's 600 lines.
Cells that only a notebook has (``%dist_compare``, ``--find-divergence``, and a cell that reads the state a failed
cell left) are tagged ``nbdist-skip``: ``nbdist export`` leaves them out, and the cells kept give the same values
in the notebook and in its script, since every one that draws random numbers seeds first.
"""

from __future__ import annotations

from lessons import Lesson, code, md

NOTEBOOK_ONLY = "nbdist-skip"  # the tag nbdist export leaves out (nbdist/job/convert.py)

REPLICAS = Lesson("5_replicas", "When replicas differ", """\
Data-parallel training rests on every rank holding the same model after every step. When they part, nothing
fails: the losses drift, a checkpoint depends on the rank that wrote it. This lesson makes three classic
mistakes on purpose. Each is shown as it happens, then found with nbdist's tools (`%dist_compare`, which
compares what the ranks hold; `%%collective --find-divergence`, which names the first operation whose output
differs; `nbdist.check_replicas`, a guard for the training loop), then fixed. Only hashes cross between the
ranks to compare them, never the model. The failing cell is tagged `raises-exception`, so that *Run All* and
`nbdist run` carry on past it; the cells that use nbdist's tools are tagged `nbdist-skip`, since a script
made by `nbdist export` has no notebook to show them in.""", [
    md("model-intro", """\
## A small model, and a check

Every rank defines the same helpers: a model with a dropout, one training step on a batch, the averaging of
gradients that data parallelism does (what DDP does for you, here by hand), and `same_on_every_rank(model)`,
which gathers every rank's weights and compares them bit for bit (what the assert cells use)."""),
    code("model", """\
%%collective
import torch.nn as nn


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 1)).to(DEVICE)


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def average_gradients(model):  # data parallelism by hand: each gradient averaged over the ranks
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= WORLD_SIZE


def same_on_every_rank(model):
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(WORLD_SIZE)]
    dist.all_gather(everyone, mine)
    return all(torch.equal(w, everyone[0]) for w in everyone)


print(f"{sum(p.numel() for p in make_model().parameters())} parameters")"""),
    md("dropout-intro", """\
## 1. A dropout drawn with each rank's own seed

Some replicas stay alike with no all_reduce at all: the parts of a tensor-parallel model that every rank
computes on the same inputs (Megatron's layer norms, and the dropout after them), or, as here, every rank
training the same model on the same batch. They stay alike only if every random draw is alike. Here each rank
seeds torch with its rank before training, as one would for its own data order; the dropout draws its mask
from the same generator. **Expect:** the loss after three steps *differs* from rank to rank."""),
    code("dropout", """\
%%collective
torch.manual_seed(0)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8, device=DEVICE), torch.randn(32, 1, device=DEVICE)  # the same batch on every rank
torch.manual_seed(RANK)  # the bug: meant for this rank's own data order, the dropout draws from it too
for _ in range(3):
    loss = step(model, optimizer, x, y)
print(f"loss after 3 steps: {loss:.4f}")"""),
    md("dropout-compare-intro", """\
**Find it.** `%dist_compare model` digests every rank's parameters, entry by entry, and says which ranks hold
which value. **Expect:** `differs`, one group per rank, and the first parameter that differs (`0.weight`),
with some of its elements by rank."""),
    code("dropout-compare", "%dist_compare model", NOTEBOOK_ONLY),
    md("dropout-find-intro", """\
That says *what* parted, not *where*. Run a forward and a backward, from the same start, with
`--find-divergence`: every rank records each operation the body runs (the forward, the backward, the optimizer)
with a hash of its output, and the ranks compare their records. **Expect:** the ranks part ways at the
dropout's `aten.bernoulli_`, on the line that calls the model (line 5, counting the `%%collective` line as 1);
every operation before it agreed."""),
    code("dropout-find", """\
%%collective --find-divergence
torch.manual_seed(0)
probe = make_model()
torch.manual_seed(RANK)
loss = nn.functional.mse_loss(probe(x), y)
loss.backward()""", NOTEBOOK_ONLY),
    md("dropout-fix-intro", """\
**Fix it.** Seed torch alike on every rank, and draw what must differ by rank (here, a data order) from a
generator of its own. In the loop, `nbdist.check_replicas(model, optimizer)` after each step compares the
ranks' digests with one small collective, and raises `ReplicasDifferError` at the first step where they part.
**Expect:** the same loss on every rank, shown once."""),
    code("dropout-fixed", """\
%%collective
torch.manual_seed(0)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8, device=DEVICE), torch.randn(32, 1, device=DEVICE)
order = torch.Generator().manual_seed(RANK)  # this rank's own draws: they leave torch's generator alone
print(f"this rank's data order: {torch.randperm(4, generator=order).tolist()}")
for _ in range(3):
    loss = step(model, optimizer, x, y)
    nbdist.check_replicas(model, optimizer)
print(f"loss after 3 steps: {loss:.4f}")"""),
    code("dropout-check", """\
%%collective
assert same_on_every_rank(model)
"dropout: the same mask, the same weights on every rank" """),
    md("skip-intro", """\
## 2. An all_reduce of the gradients skipped on one rank

Without DDP, data parallelism is: each rank's gradient on its own data, an `all_reduce` of each gradient
divided by the world size, then the step. Here rank 1 skips the averaging of the second step (a decision it
takes alone: its loss, its batch, its clock) and steps on its own gradient. By hand, collectives pair by
order, not by step: rank 1's third-step gradients are averaged with the others' second-step ones, and at the
end the others wait for ever in an `all_reduce` that rank 1 never calls. nbdist compares every collective
across the ranks. **Expect:** `CollectiveMismatchError` on every rank when rank 1 finishes: it issued fewer
collectives than the others, who wait in the next `all_reduce`."""),
    code("skip", """\
%%collective
torch.manual_seed(0)
model = make_model().eval()  # no dropout here: this section is about the averaging
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(RANK)  # each rank's own data
for i in range(3):
    x, y = torch.randn(32, 8, device=DEVICE), torch.randn(32, 1, device=DEVICE)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    if not (RANK == 1 and i == 1):  # the bug: a rank that decides alone to skip the averaging
        average_gradients(model)
    optimizer.step()""", "raises-exception"),
    md("skip-found-intro", """\
**Find it.** nbdist stopped the cell, but the steps already taken had parted the replicas. `check_replicas`
says so (it raises `ReplicasDifferError`, an `AssertionError`, printed here), and `%dist_compare` shows the
elements. **Expect:** the first parameter differs, rank 1 holding one value and every other rank another."""),
    code("skip-found", """\
%%collective
try:
    nbdist.check_replicas(model)
except nbdist.errors.ReplicasDifferError as e:
    print(e)""", NOTEBOOK_ONLY),
    code("skip-compare", "%dist_compare model", NOTEBOOK_ONLY),
    md("skip-fix-intro", """\
**Fix it.** A decision that one rank takes must be taken by every rank: all-reduce it first, and skip the step
(the averaging *and* the optimizer's step) on every rank or on none. PyTorch's `GradScaler` does just this
with the infinities it finds in gradients. **Expect:** every rank skips the second step, and the weights
stay alike after every step (`check_replicas` is silent)."""),
    code("skip-fixed", """\
%%collective
torch.manual_seed(0)
model = make_model().eval()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(RANK)
skipped = []
for i in range(3):
    x, y = torch.randn(32, 8, device=DEVICE), torch.randn(32, 1, device=DEVICE)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    skip = torch.tensor([float(RANK == 1 and i == 1)], device=DEVICE)  # what this rank alone would decide
    dist.all_reduce(skip, op=dist.ReduceOp.MAX)  # ... decided by every rank
    if skip.item():
        skipped.append(i + 1)
        continue
    average_gradients(model)
    optimizer.step()
    nbdist.check_replicas(model, optimizer)
print(f"skipped step(s): {skipped}")"""),
    code("skip-check", """\
%%collective
assert skipped == [2], skipped
assert same_on_every_rank(model)
"skipped averaging: decided together, the same weights on every rank" """),
    md("seed-intro", """\
## 3. A model built before `manual_seed` on one rank

Rank 0 builds the model early (to print its size, say), before `torch.manual_seed(0)`; every other rank
builds it after. Each rank draws the initial weights from its generator, so rank 0's differ. **Expect:** the
first weights *differ* between rank 0 and the others."""),
    code("seed", """\
%%collective
torch.manual_seed(100 + RANK)  # whatever state the generator was in
if RANK == 0:
    model = make_model()  # the bug: built before the seed, on one rank
    print(f"{sum(p.numel() for p in model.parameters())} parameters")
torch.manual_seed(0)
if RANK != 0:
    model = make_model()
print(f"first weights: {[round(w, 4) for w in model[0].weight[0, :3].tolist()]}")"""),
    md("seed-compare-intro", """\
**Find it.** `%dist_compare model` names the first parameter that differs; `--rng` compares the random
generators too. **Expect:** every entry of the model differs between rank 0 and the others, the first being
`0.weight`. Among the generators, torch's *state* differs between rank 0 and the others, though its seed
(`torch.initial_seed`, the one entry not named) is alike: every other rank drew the model's weights after the
seed, rank 0 nothing. Python's `random` and numpy's differ on every rank: nothing seeded them, so each process
took its own seed from the operating system."""),
    code("seed-compare", "%dist_compare model --rng", NOTEBOOK_ONLY),
    md("seed-fix-intro", """\
**Fix it.** Seed before building, on every rank; or, wherever the model comes from, broadcast rank 0's
parameters and buffers to every rank before training, as DDP does when it wraps a model. **Expect:** the same
first weights on every rank, shown once: rank 0's."""),
    code("seed-fixed", """\
%%collective
for tensor in model.state_dict().values():
    dist.broadcast(tensor, src=0)
print(f"first weights: {[round(w, 4) for w in model[0].weight[0, :3].tolist()]}")"""),
    code("seed-check", """\
%%collective
nbdist.check_replicas(model)  # ReplicasDifferError is an AssertionError
assert same_on_every_rank(model)
"built before the seed: broadcast from rank 0, the same weights on every rank" """),
])
