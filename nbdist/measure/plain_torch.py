"""The same code on N plain torch processes (gloo on 127.0.0.1, no nbdist, no kernel): torch's own answer.

``nbdist demo`` and the tests run a cell's code here too, in the same environment, and compare
what the world computed with what plain torch computes (the DDP training's weights, bit for bit).
Each rank is ``python -m nbdist.measure.plain_torch``: it forms the group from ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, runs the code with ``torch``, ``dist``,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``DEVICE`` (the CPU) defined as ``%%dist_init``
defines them, and prints the named values as JSON on its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from ..backend import threads
from ..errors import NbdistError
from ..world import netinfo

MARK = "nbdist-plain-torch: "


def run(code: str, world_size: int, names: tuple[str, ...], timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run ``code`` on ``world_size`` plain torch processes; returns each rank's values of ``names``."""
    port = netinfo.first_free_port(range(30100, 30300))
    if port is None:
        raise NbdistError("no free port in 30100-30299 for the plain torch run")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    try:
        procs = []
        for rank in range(world_size):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            count = threads.plan(os.environ)  # the threads torchrun (and nbdist) give each rank
            if count is not None:
                env[threads.VARIABLE] = str(count)
            procs.append(subprocess.Popen([sys.executable, "-m", "nbdist.measure.plain_torch", f.name, *names],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = []
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    finally:
        os.unlink(f.name)
    values = []
    for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        lines = [line for line in out.splitlines() if line.startswith(MARK)]
        if p.returncode != 0 or not lines:
            tail = "\n".join(out.splitlines()[-15:])
            raise NbdistError(f"the plain torch run failed on rank {rank} (exit {p.returncode}):\n{tail}")
        values.append(json.loads(lines[-1].removeprefix(MARK)))
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbdist.measure.plain_torch", description=__doc__.split("\n")[0])
    parser.add_argument("code", help="a file of Python code to run on this rank")
    parser.add_argument("names", nargs="*", help="names whose values to print as JSON")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        namespace: dict[str, Any] = {"torch": torch, "dist": dist, "RANK": rank, "WORLD_SIZE": world_size,
                                     "LOCAL_RANK": int(os.environ.get("LOCAL_RANK", rank)),
                                     "DEVICE": torch.device("cpu"), "__name__": "__main__"}
        with open(args.code) as f:
            exec(compile(f.read(), args.code, "exec"), namespace)  # noqa: S102 (the caller's own code)
        print(MARK + json.dumps({name: namespace.get(name) for name in args.names}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
