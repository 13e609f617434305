"""Write walkthrough.ipynb: the two-notebook walkthrough in one notebook, with ``%dist_init --spawn 2``.

The ``%%collective`` cells are the two-notebook example's (from ``nbdist.demo.STEPS``,
through ``examples/two_notebooks/make_notebooks.py``), so the examples and the demo
cannot drift apart.

    python examples/one_notebook/make_notebook.py [--out DIR]

tests/test_examples.py checks that the committed notebook is this script's output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's nbdist, installed or not
sys.path.insert(0, str(HERE.parent / "two_notebooks"))

from make_notebooks import notebook_of, walkthrough_cells, write_all  # noqa: E402

_INTRO = """\
# nbdist: one notebook drives a two-rank `torch.distributed` world

The two-notebook HCCL walkthrough (AllReduce, Broadcast, AllGather, DDP training), run from **this
one notebook**. `%dist_init --spawn 2` makes this notebook rank 0 and starts rank 1 as a worker
kernel on this machine (through jupyter_client, never a fork). The worker follows this notebook:
every `%%collective` cell here runs on both ranks, in lockstep, and the table below each cell shows
**every rank's output side by side**, one column per rank.

Nothing else is needed: no second notebook, no address to type. The cells use `DEVICE`, this rank's
`torch.device`, so they run unchanged on CPU (gloo), GPUs (NCCL) and Ascend NPUs (HCCL): each worker
gets its own device. For two machines, or two people, see `examples/two_notebooks/`."""

_INIT_INTRO = """\
## Start the world

The worker kernel joins the world on `127.0.0.1`, port 29500 (or a free port, shown, when 29500 is
busy), with a random token that only this notebook and its worker know: the cells it receives
are signed with it. `%dist_workers` shows the worker: its pid, rank, device and last lines."""

_END = """\
## Status, and leaving

`%dist_status` shows every rank; `%dist_barrier` runs on the worker too. `%dist_destroy` leaves the
world and stops the worker kernel (so do restarting this kernel and closing this notebook)."""


def build() -> nbformat.NotebookNode:
    """The notebook; cell ids are fixed so that the output is reproducible."""
    cells = [
        new_markdown_cell(_INTRO, id="intro"),
        new_code_cell("%load_ext nbdist", id="load-ext"),
        new_markdown_cell(_INIT_INTRO, id="init-intro"),
        new_code_cell("%dist_init --spawn 2", id="dist-init"),
        new_code_cell("%dist_workers", id="workers"),
    ]
    return notebook_of(cells + walkthrough_cells(_END))


def main(argv: list[str] | None = None) -> int:
    return write_all(__doc__.split("\n", 1)[0], HERE, lambda: {"walkthrough.ipynb": build()}, argv)


if __name__ == "__main__":
    sys.exit(main())
