"""What a script that ``nbdist export`` wrote imports: its world from the launcher, its flags, its Out rows.

``init()`` forms the world as ``%%dist_init`` would, from torchrun's or Slurm's
variables (:mod:`nbdist.job.runtime`); ``parameters()`` reads the notebook's
parameters from the command line (:mod:`nbdist.job.params`); ``out()`` prints a
cell's last expression; ``on_ranks()`` is a ``%%collective --ranks`` set. Importing
this module imports no torch.
"""

from __future__ import annotations

import sys
from typing import Any

from .job.params import parameters as _parameters
from .job.runtime import Joined, init, on_ranks, out

__all__ = ["Joined", "init", "on_ranks", "out", "parameters"]


def parameters(defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` (the parameters cell's names and values) with the command line's ``--NAME VALUE``."""
    return _parameters(defaults, sys.argv[1:], prog=sys.argv[0] or None)
