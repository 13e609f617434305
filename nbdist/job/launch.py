"""``nbdist export --run N``: the exported script under ``torchrun --standalone --nproc-per-node N``.

It checks a script in one command: torchrun starts N processes on this machine,
each marks its lines ``[rank k]`` (:mod:`nbdist.job.runtime`), and the exit
status is torchrun's (0 when every rank finished).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def command(script: Path, nproc: int, args: Sequence[str] = ()) -> list[str]:
    """The torchrun command line for ``script`` on ``nproc`` local ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(script), *args]


def run(script: Path, nproc: int, args: Sequence[str] = (), timeout: float | None = None) -> int:
    """Run ``script`` on ``nproc`` ranks; their output goes to this process's stdout and stderr."""
    sys.stdout.flush()
    try:
        return subprocess.run(command(script, nproc, args), timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"nbdist export: the script ran past {timeout:g} s; torchrun was stopped", file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        return 130
