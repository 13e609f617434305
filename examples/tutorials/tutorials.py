"""PyTorch's distributed tutorials, minimal and faithful, as one script that torchrun runs on 2 ranks.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 examples/tutorials/tutorials.py

Each ``# %%`` section below is one cell of ``tutorials.ipynb`` (make_notebook.py writes the notebook from
this file, every section a ``%%collective`` cell). The ``setup`` section is the one that differs: the
notebook has the tutorials' own ``init_process``, ``setup`` and ``cleanup``, pasted as they are, at the
end of its first cell (nbdist answers their ``init_process_group``); here they are what torchrun needs
(its ``MASTER_ADDR`` and ``MASTER_PORT``, one group for the whole run). Every other line runs in both,
and each rank prints its values at full precision, so tests/test_tutorials.py compares the notebook's
lines with this script's, rank by rank, bit for bit.

Sources (pytorch/tutorials): ``intermediate_source/dist_tuto.rst`` ("Writing Distributed Applications with
PyTorch"), ``intermediate_source/ddp_tutorial.rst`` ("Getting Started with Distributed Data Parallel"),
and the FSDP2 tutorial (``intermediate_source/FSDP_tutorial.rst``, "Getting Started with Fully Sharded
Data Parallel (FSDP2)", whose code is pytorch/examples ``distributed/FSDP2/example.py``). Changed for
CPU and for a comparison: gloo everywhere, no ``.to(rank)`` or ``device_ids``, a seeded generated data
set instead of MNIST (no download), seeds where a tutorial draws at random, small sizes, and values
printed exactly (``float.hex`` and lists of floats) where the tutorials print rounded tensors.
"""
# ruff: noqa: E402, UP004, UP008, UP031, B006  (the tutorials' code, as they write it)

import os

RANK = int(os.environ["RANK"])  # in the notebook, %%dist_init defines these two
WORLD_SIZE = int(os.environ["WORLD_SIZE"])

# %% imports: the first cell (the lines above are the script's alone)
import hashlib
import os
import tempfile
from math import ceil
from random import Random

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def checksum(tensors):
    """Every value, bit for bit: the float64 sum in hex, and a SHA-256 of the exact values."""
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    digest = hashlib.sha256(repr(flat.tolist()).encode()).hexdigest()[:16]
    return f"sum {flat.sum().item().hex()} sha256 {digest}"


print(f"rank {RANK} of {WORLD_SIZE}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")

# %% setup
def init_process(rank, size, fn, backend="gloo"):
    """dist_tuto's, for torchrun: the master is torchrun's, and the group is made once, at the first call."""
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


def setup(rank, world_size):
    """ddp_tutorial's, for torchrun: the master is torchrun's (dist_tuto's group may still be there)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    """ddp_tutorial's, for torchrun: the group stays until the script ends. Made again in the same process,
    a group takes the name and store keys of the one destroyed, and its set-up can hang."""


# %% blocking
def run(rank, size):
    """dist_tuto, "Point-to-Point Communication": blocking send and recv."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    else:
        # Receive tensor from process 0
        dist.recv(tensor=tensor, src=0)
    print("Rank ", rank, " has data ", tensor[0].item())


init_process(RANK, WORLD_SIZE, run)

# %% non-blocking
def run(rank, size):
    """dist_tuto, "Point-to-Point Communication": non-blocking isend and irecv."""
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending")
    else:
        # Receive tensor from process 0
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving")
    req.wait()
    print("Rank ", rank, " has data ", tensor[0].item())


init_process(RANK, WORLD_SIZE, run)

# %% all-reduce
def run(rank, size):
    """dist_tuto, "Collective Communication": all_reduce on a group from new_group."""
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    print("Rank ", rank, " has data ", tensor[0].item())


init_process(RANK, WORLD_SIZE, run)

# %% ring
def allreduce(send, recv):
    """dist_tuto, "Our Own Ring-Allreduce": a ring-reduce with addition."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.clone()
    recv_buff = send.clone()
    accum = send.clone()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def run(rank, size):
    """The ring all-reduce on each rank's own tensor, beside dist.all_reduce of the same tensor."""
    torch.manual_seed(rank)
    send = torch.randn(4)
    recv = torch.zeros(4)
    allreduce(send, recv)
    reference = send.clone()
    dist.all_reduce(reference, op=dist.ReduceOp.SUM)
    print("Rank ", rank, " ring all-reduce ", recv.tolist(), " all_reduce ", reference.tolist())


init_process(RANK, WORLD_SIZE, run)

# %% sgd
class Partition(object):
    """dist_tuto, "Distributed Training": dataset partitioning helper."""

    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        data_idx = self.index[index]
        return self.data[data_idx]


class DataPartitioner(object):

    def __init__(self, data, sizes=[0.7, 0.2, 0.1], seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
        rng.seed(seed)
        data_len = len(data)
        indexes = [x for x in range(0, data_len)]
        rng.shuffle(indexes)

        for frac in sizes:
            part_len = int(frac * data_len)
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def partition_dataset():
    """The tutorial's, on 256 generated 28x28 images of 10 classes (seeded torch.randn) instead of MNIST."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(256, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (256,), generator=generator)
    dataset = torch.utils.data.TensorDataset(images, labels)
    size = dist.get_world_size()
    bsz = 128 // size
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)
    return train_set, bsz


class Net(nn.Module):
    """The tutorial's network (PyTorch's MNIST example)."""

    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def average_gradients(model):
    """Gradient averaging."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank, size):
    """Distributed synchronous SGD (10 epochs, as the tutorial's)."""
    torch.manual_seed(1234)
    train_set, bsz = partition_dataset()
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)

    num_batches = ceil(len(train_set.dataset) / float(bsz))
    for epoch in range(10):
        epoch_loss = 0.0
        for data, target in train_set:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
        print("Rank ", dist.get_rank(), ", epoch ", epoch, ": ", (epoch_loss / num_batches).hex())
    print("Rank ", dist.get_rank(), " weights ", checksum(model.parameters()))


init_process(RANK, WORLD_SIZE, run)

# %% ddp-basic
class ToyModel(nn.Module):
    """ddp_tutorial, "Basic Use Case"."""

    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(rank)  # each rank its own model and data, as the tutorial's unseeded ranks have

    # create model (on the CPU: no .to(rank), no device_ids)
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    print(f"rank {rank} weights {checksum(ddp_model.parameters())}")

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")


demo_basic(RANK, WORLD_SIZE)

# %% ddp-checkpoint
def demo_checkpoint(rank, world_size):
    """ddp_tutorial, "Save and Load Checkpoints"."""
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(rank)

    model = ToyModel()
    ddp_model = DDP(model)

    CHECKPOINT_PATH = tempfile.gettempdir() + "/model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly (on the CPU every tensor stays where it is)
    map_location = {"cuda:%d" % 0: "cuda:%d" % rank}
    ddp_model.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))
    print(f"rank {rank} loaded {checksum(ddp_model.parameters())}")

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)

    loss_fn(outputs, labels).backward()
    optimizer.step()
    print(f"rank {rank} weights {checksum(ddp_model.parameters())}")

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.

    if rank == 0:
        os.remove(CHECKPOINT_PATH)

    cleanup()
    print(f"Finished running DDP checkpoint example on rank {rank}.")


demo_checkpoint(RANK, WORLD_SIZE)

# %% fsdp2
from torch.distributed.fsdp import FSDPModule, fully_shard


class Transformer(nn.Module):
    """A small stand-in for the FSDP2 example's Transformer: token embeddings, layers, a norm, an output."""

    def __init__(self, vocab_size=64, dim=32, n_heads=4, n_layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, n_heads, 4 * dim, dropout=0.0, batch_first=True)
            for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab_size)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def demo_fsdp2(rank, world_size):
    """The FSDP2 example: fully_shard each layer, then the model; Adam, 10 steps, clip_grad_norm_."""
    setup(rank, world_size)
    torch.manual_seed(0)
    vocab_size, batch_size, seq_len = 64, 8, 16
    model = Transformer(vocab_size)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    assert isinstance(model, Transformer) and isinstance(model, FSDPModule)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(10):
        x = torch.randint(0, vocab_size, (batch_size, seq_len))
        loss = model(x).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} loss {loss.item().hex()}")
    shards = [p.to_local() for p in model.parameters()]  # this rank's shard of each parameter
    full = [p.full_tensor() for p in model.parameters()]  # every rank's shards, gathered
    print(f"rank {rank} shard {checksum(shards)} full {checksum(full)}")
    cleanup()


demo_fsdp2(RANK, WORLD_SIZE)
# %% end: the script's alone (the notebook ends with %dist_destroy)
dist.destroy_process_group()
