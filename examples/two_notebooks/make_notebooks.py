"""Write rank0.ipynb and rank1.ipynb: the two-notebook walkthrough as two ranks of one world.

The ``%%collective`` cells come from ``nbdist.demo.STEPS`` (what ``nbdist demo``
runs), so the notebooks and the demo cannot drift apart; only the
configuration area in the ``%%dist_init`` cell differs between the notebooks.

    python examples/two_notebooks/make_notebooks.py [--out DIR]

tests/test_examples.py checks that the committed notebooks are this script's output.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's nbdist, installed or not

from nbdist.demo import STEPS  # noqa: E402

WORLD_SIZE = 2
MASTER_PORT = 29500

# The demo ends each step by storing the value it checks (``_nbdist_demo = EXPR``);
# in a notebook that value is simply the cell's last expression, shown in the ``Out`` row.
_BOOKKEEPING = re.compile(r"^_nbdist_demo = (?P<expr>.+)$")
# Where a step's checked value reads poorly as an Out, a clearer expression of the same facts.
_OUT = {"ddp": '{"epochs": len(losses), "weight checksum": checksum, "same weights": identical}'}

_EXPECT = {
    "allreduce": """\
## AllReduce

Every rank contributes its rank number and `all_reduce` sums them in place, so **every rank ends
with 0 + 1 = 1.0**. Each rank's printed lines appear in its own column; the `Out` row (the cell's
last expression) is shown once, marked *identical on all 2 ranks*.""",
    "broadcast": """\
## Broadcast

Rank 0 holds `[42.0, 100.0, 256.0]`, rank 1 a tensor of zeros; `broadcast(src=0)` copies rank 0's
tensor to every rank, so **both ranks print `[42.0, 100.0, 256.0]`**.""",
    "allgather": """\
## AllGather

Each rank contributes `RANK * 10`; `all_gather` gives every rank the list of all contributions in
rank order, so **both ranks get `[0.0, 10.0]`**.""",
    "ddp": """\
## DDP training

A small model (two linear layers, about 8.4 million parameters) wrapped in
`DistributedDataParallel`, trained for **5 epochs** on random data. Each rank draws its own data,
so the per-rank losses differ; DDP averages the gradients over the ranks at every `backward()`,
so the weights stay the same everywhere, bit for bit: the cell gathers every rank's weights and
compares them element by element (`torch.equal`), and the `Out` row (epochs run, a checksum of all
weights, and that comparison) is **identical on all 2 ranks**. On a CPU this cell takes a few seconds.""",
}


def _intro(rank: int) -> str:
    other = 1 - rank
    return f"""\
# nbdist: two notebooks, one `torch.distributed` world — this is rank {rank}

This notebook and its twin, `rank{other}.ipynb`, are the two ranks of one `torch.distributed`
world, following the two-notebook HCCL walkthrough (AllReduce, Broadcast, AllGather, DDP training)
with nbdist instead of hand-written `init_process_group` calls.

**Open both notebooks side by side in JupyterLab** (drag one tab to the right half of the window)
and run them top to bottom. `%%dist_init` waits until both notebooks have run it, and every
`%%collective` cell waits for the same cell in the other notebook, so it does not matter which
notebook goes first. Every notebook shows **every rank's output side by side**, one column per rank.

* **One machine** (a laptop, mybinder.org): leave `MASTER_ADDR = '127.0.0.1'`.
* **Two machines**: in *both* notebooks set `MASTER_ADDR` to rank 0's address (in the walkthrough,
  `'10.202.73.94'`), and make sure port 29500 on rank 0's machine is open to the other machine.
  The backend (gloo, NCCL or HCCL) also connects the machines directly, so no firewall may sit
  between them.

The cells use `DEVICE`, this rank's `torch.device`, so they run unchanged on CPU (gloo), GPUs
(NCCL) and Ascend NPUs (HCCL, with `torch_npu`): nbdist picks the backend and the device."""


_INIT_INTRO = """\
## Join the world

The body of `%%dist_init` is the **configuration area**, the only cell that differs between the two
notebooks. Rank 0 starts the rendezvous server on `MASTER_ADDR:MASTER_PORT`; the cell then shows who
has joined until both ranks are in (it waits up to 10 minutes), and finally a table of the world:
host, backend and device of every rank. Afterwards `torch`, `dist` (`torch.distributed`), `RANK`,
`WORLD_SIZE`, `LOCAL_RANK` and `DEVICE` are defined."""


def _config(rank: int) -> str:
    settings = [
        (f"RANK = {rank}", "this notebook's rank: 0 in rank0.ipynb, 1 in rank1.ipynb"),
        (f"WORLD_SIZE = {WORLD_SIZE}", "number of notebooks in the world"),
        ("MASTER_ADDR = '127.0.0.1'", "rank 0's address; 127.0.0.1 when both notebooks run on one machine"),
        (f"MASTER_PORT = {MASTER_PORT}", "rendezvous port on rank 0's machine"),
        ("# DEVICE_ID = 0", "optional: device index (default: one device per notebook on a machine)"),
        ("# BACKEND = 'hccl'", "optional: 'gloo', 'nccl' or 'hccl' (default: picked from the hardware)"),
    ]
    width = max(len(code) for code, _ in settings) + 2
    lines = ["%%dist_init", "# ===== configuration area: the only cell that differs between the notebooks ====="]
    lines += [f"{code.ljust(width)}# {comment}" for code, comment in settings]
    return "\n".join(lines)


_END = """\
## Status, and leaving

`%dist_status` shows every rank: joined or left, alive (heartbeat), what it did last, backend, device
and host. `%dist_barrier` waits until every rank got here, so that no notebook leaves while another still
needs the world (rank 0's kernel hosts the rendezvous server). `%dist_destroy` leaves the world (the
process group is destroyed); run `%%dist_init` again to rejoin."""


def collective_source(code: str, key: str) -> str:
    """A demo step as a notebook cell: ``%%collective``, the step, its checked value as the last line."""
    lines = code.rstrip("\n").split("\n")
    match = _BOOKKEEPING.match(lines[-1])
    if match is None or any("_nbdist_demo" in line for line in lines[:-1]):
        raise SystemExit(f"nbdist.demo step {key!r} no longer ends with '_nbdist_demo = ...': update {__file__}")
    return "\n".join(["%%collective", *lines[:-1], _OUT.get(key, match["expr"])])


def build(rank: int) -> nbformat.NotebookNode:
    """The notebook of one rank; cell ids are fixed so that the output is reproducible."""
    cells = [
        new_markdown_cell(_intro(rank), id="intro"),
        new_code_cell("%load_ext nbdist", id="load-ext"),
        new_markdown_cell(_INIT_INTRO, id="init-intro"),
        new_code_cell(_config(rank), id="dist-init"),
    ]
    return notebook_of(cells + walkthrough_cells(_END))


def walkthrough_cells(end: str) -> list[nbformat.NotebookNode]:
    """The walkthrough's steps, each explained, then status and leaving (also examples/one_notebook's)."""
    cells = []
    for _title, code, key in STEPS:
        cells.append(new_markdown_cell(_EXPECT[key], id=f"{key}-intro"))
        cells.append(new_code_cell(collective_source(code, key), id=key))
    return cells + [
        new_markdown_cell(end, id="end-intro"),
        new_code_cell("%dist_status", id="status"),
        new_code_cell("%dist_barrier", id="barrier"),
        new_code_cell("%dist_destroy", id="destroy"),
    ]


def notebook_of(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    """A validated nbformat 4.5 notebook of ``cells`` for the python3 kernel (also examples/one_notebook's)."""
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nb


def write_all(description: str, here: Path, notebooks: Callable[[], dict[str, nbformat.NotebookNode]],
              argv: list[str] | None = None) -> int:
    """A generator's command line: ``--out DIR`` (default ``here``), then each notebook written there."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=here, help="folder to write into (default: next to this script)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, nb in notebooks().items():
        path = args.out / name
        path.write_text(nbformat.writes(nb, version=4), encoding="utf-8", newline="\n")
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return write_all(__doc__.split("\n", 1)[0], HERE,
                     lambda: {f"rank{rank}.ipynb": build(rank) for rank in range(WORLD_SIZE)}, argv)


if __name__ == "__main__":
    sys.exit(main())
