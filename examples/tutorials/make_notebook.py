"""Write tutorials.ipynb: PyTorch's distributed tutorials, each ``# %%`` section of tutorials.py a cell.

The code is tutorials.py's, the script that torchrun runs, so the notebook and the script cannot drift
apart. One section differs: in place of the script's ``setup`` section (what torchrun needs), the first
cell ends with the tutorials' own ``init_process``, ``setup`` and ``cleanup``, pasted as they are
(``SETUP`` below), which nbdist answers in a formed world.

    python examples/tutorials/make_notebook.py [--out DIR]

tests/test_tutorials.py checks that the committed notebook is this script's output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "tutorials.py"
sys.path.insert(0, str(HERE.parent / "two_notebooks"))

from make_notebooks import notebook_of, write_all  # noqa: E402

# dist_tuto's init_process and ddp_tutorial's setup and cleanup, as the tutorials print them.
SETUP = '''\
def init_process(rank, size, fn, backend='gloo'):
    """ Initialize the distributed environment. """
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = '29500'
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()'''

INTRO = """\
# PyTorch's distributed tutorials, in `%%collective` cells

The code of PyTorch's official distributed tutorials, minimal and faithful, each piece in a `%%collective`
cell that runs on both ranks: from `intermediate_source/dist_tuto.rst` (blocking and non-blocking
point-to-point, all_reduce on a `new_group`, the hand-written ring all-reduce, synchronous SGD), from
`intermediate_source/ddp_tutorial.rst` (`demo_basic`, `demo_checkpoint`) and the FSDP2 example
(`fully_shard`, on the CPU). The tutorials' own `setup()` and `cleanup()` stay as they are: nbdist answers
their `init_process_group` (see the how-to "PyTorch's tutorials, pasted").

Changed for the CPU and for a comparison: gloo, no `.to(rank)` or `device_ids`, a generated data set
instead of MNIST, seeds where a tutorial draws at random, small sizes, and every value printed exactly
(`float.hex`, lists of floats, a SHA-256 of a model's values). `tutorials.py` beside this notebook is the
same code for `torchrun`; CI runs both and compares every rank's lines, bit for bit
(`tests/test_tutorials.py`).

**How to run it.** As it stands, this notebook drives the world: `SPAWN = 2` below makes it rank 0 and
starts rank 1 as a local worker kernel. For one notebook per rank, set `SPAWN = 0`, copy the notebook and
give each copy its own `RANK`. The tutorials are written for 2 ranks. Headless, as CI runs it:
`nbdist run tutorials.ipynb --world-size 2 --spawn` or `nbdist run tutorials.ipynb --world-size 2`."""

PARAMETERS = """\
# Parameters: `nbdist run` sets these for each copy it runs.
SPAWN = 2                  # this notebook drives SPAWN ranks (local worker kernels); 0: one notebook per rank
RANK = 0                   # with SPAWN = 0: this notebook's rank (0 in the first notebook, 1 in the other)
WORLD_SIZE = 2             # the tutorials are written for 2 ranks
MASTER_ADDR = "127.0.0.1"  # with SPAWN = 0: rank 0's address
MASTER_PORT = 29500"""

# Each section's heading: the tutorial and its section, and what to expect.
HEADINGS = {
    "imports": """\
## Imports, and the tutorials' `init_process`, `setup` and `cleanup`, as they are

The tutorials' imports, and `checksum`, which prints a model's values exactly; each rank says how many
threads torch uses: one, as torchrun gives its ranks. Then dist_tuto's `init_process` and ddp_tutorial's
`setup` and `cleanup`: in a formed world each `init_process_group` call that agrees with the world is
ignored, with one line on each rank, and after `cleanup()` the next `setup()` builds the world's group
again.""",
    "setup": "",  # in the imports cell
    "blocking": """\
## dist_tuto: blocking point-to-point

Rank 0 sends a tensor holding 1.0; rank 1 receives it. **Both ranks have 1.0.**""",
    "non-blocking": """\
## dist_tuto: non-blocking point-to-point

The same with `isend` and `irecv`, then `req.wait()`.""",
    "all-reduce": """\
## dist_tuto: all_reduce on a group

A group of ranks 0 and 1 from `dist.new_group`, and a sum over it: **both ranks have 2.0.**""",
    "ring": """\
## dist_tuto: the hand-written ring all-reduce

`allreduce(send, recv)` passes buffers round the ring with `isend` and `recv`; beside it, `dist.all_reduce`
of the same tensors. **The two lists are equal, and equal on both ranks.**""",
    "sgd": """\
## dist_tuto: synchronous SGD

The tutorial's `DataPartitioner`, `Net` and `average_gradients`, 10 epochs on 256 generated images. Each
rank's loss is its own partition's; **the weights are the same on both ranks.**""",
    "ddp-basic": """\
## ddp_tutorial: `demo_basic`

`ToyModel` in `DistributedDataParallel`, one SGD step. **Both ranks end with the same weights.**""",
    "ddp-checkpoint": """\
## ddp_tutorial: `demo_checkpoint`

Rank 0 saves the DDP model's state, a barrier, every rank loads it with a `map_location`, one step.""",
    "fsdp2": """\
## FSDP2: `fully_shard` on the CPU

Each layer sharded with `fully_shard`, then the whole model; Adam, 10 steps, gradients clipped. Each rank
holds its own shard of every parameter (`shard`); gathered, **the full parameters are the same on both
ranks.**""",
}

END = """\
## Leaving

`%dist_barrier` waits for every rank; `%dist_destroy` leaves the world (and stops the worker kernel)."""

_SECTION = re.compile(r"^# %% ([\w-]+)\b.*\n", re.M)


def sections(text: str) -> dict[str, str]:
    """The script's ``# %% NAME`` sections, name -> code; the lines before the first and the ``end`` section are
    the script's alone."""
    parts = _SECTION.split(text)
    found = {name: code.strip("\n") for name, code in zip(parts[1::2], parts[2::2], strict=True)}
    found.pop("end", None)
    return found


def build() -> nbformat.NotebookNode:
    """The notebook; cell ids are the sections' names, so that the output is reproducible."""
    found = sections(SCRIPT.read_text(encoding="utf-8"))
    if list(found) != list(HEADINGS):
        raise SystemExit(f"make_notebook.py: tutorials.py's sections {list(found)} are not {list(HEADINGS)}")
    found["imports"] += f"\n\n\n{SETUP}"  # the script's setup is torchrun's; the notebook's the tutorials'
    del found["setup"]
    cells = [
        new_markdown_cell(INTRO, id="intro"),
        new_code_cell("%load_ext nbdist", id="load-ext"),
        new_code_cell(PARAMETERS, id="parameters", metadata={"tags": ["parameters"]}),
        new_code_cell("%%dist_init\n# joins with the parameters above", id="dist-init"),
    ]
    for name, code in found.items():
        cells.append(new_markdown_cell(HEADINGS[name], id=f"{name}-intro"))
        cells.append(new_code_cell(f"%%collective\n{code}", id=name))
    cells += [new_markdown_cell(END, id="end-intro"), new_code_cell("%dist_barrier", id="barrier"),
              new_code_cell("%dist_destroy", id="destroy")]
    return notebook_of(cells)


def main(argv: list[str] | None = None) -> int:
    return write_all(__doc__.split("\n", 1)[0], HERE, lambda: {"tutorials.ipynb": build()}, argv)


if __name__ == "__main__":
    sys.exit(main())
