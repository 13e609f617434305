"""How many CPU threads torch uses on a rank: one, as torchrun gives its ranks, unless the user chose.

torchrun starts each rank with ``OMP_NUM_THREADS=1`` when the user has not set it (for several ranks on
a host, so they do not fight over its cores). A rank whose torch uses another number of threads sums in
another order, so training results differ from torchrun's, and from ``nbdist export``'s script, from
about the 7th significant digit. Every nbdist rank (a notebook, a spawned or Slurm worker, ``nbdist
follow``, an exported script) therefore takes one thread unless ``OMP_NUM_THREADS`` was set.
"""

from __future__ import annotations

from collections.abc import Mapping

VARIABLE = "OMP_NUM_THREADS"
TORCHRUN_THREADS = 1


def plan(environ: Mapping[str, str]) -> int | None:
    """The thread count to set on this rank, or None where the user chose (``OMP_NUM_THREADS`` is set)."""
    return None if environ.get(VARIABLE, "").strip() else TORCHRUN_THREADS


def apply(threads: int) -> int:
    """Make torch use ``threads`` threads for work within an op; returns what it used before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return before
