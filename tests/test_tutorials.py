"""PyTorch's distributed tutorials (examples/tutorials/): through nbdist, as under torchrun, bit for bit.

The code of ``dist_tuto`` (blocking and non-blocking point-to-point, all_reduce on a ``new_group``, the ring
all-reduce, synchronous SGD), ``ddp_tutorial`` (``demo_basic``, ``demo_checkpoint``) and the FSDP2 example
(``fully_shard`` on the CPU) runs once under ``torchrun`` (2 processes, gloo, ``OMP_NUM_THREADS=1``) as
tutorials.py, and as tutorials.ipynb through ``nbdist run``, driven from one notebook (``--spawn``) and as two
peer notebooks. Each rank prints its values exactly (``float.hex``, lists of floats, SHA-256 of a model's
values); every rank's lines in the notebook must equal that rank's lines under torchrun, one for one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import as_generated
from .exported import notebook_values

FOLDER = Path(__file__).resolve().parents[1] / "examples" / "tutorials"
NOTEBOOK = FOLDER / "tutorials.ipynb"
SCRIPT = FOLDER / "tutorials.py"


@pytest.fixture(scope="module")
def torchrun_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[str]]:
    """Each rank's stdout lines from one ``torchrun --standalone --nproc-per-node 2 tutorials.py``."""
    tmp = tmp_path_factory.mktemp("torchrun")  # demo_checkpoint's file, in TMPDIR, is this run's own
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    # Each rank's stdout into a file of its own (--redirects 1), read once torchrun ended. With --tee, read from
    # torchrun's own stdout, rank 0 once had 9 epoch lines of 10 in a full run of the suite: torchrun copies each
    # file there with readline() as it grows (elastic's tail_logfile), so a line read before its end was written
    # goes out in two pieces, each with its rank's prefix, the two ranks' pieces in one stream.
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "--log-dir", str(tmp / "logs"), "--redirects", "1", str(SCRIPT)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp)
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = {rank: found.read_text().splitlines()
             for rank in (0, 1) for found in (tmp / "logs").glob(f"*/attempt_0/{rank}/stdout.log")}
    assert sorted(lines) == [0, 1], sorted(str(f) for f in (tmp / "logs").rglob("*"))
    _hold_the_tutorials_facts(lines)
    return lines


def _hold_the_tutorials_facts(lines: dict[int, list[str]]) -> None:
    """What the tutorials teach holds in these lines, so that equal lines are not equally empty."""
    for rank in (0, 1):
        mine = lines[rank]
        assert mine[0] == f"rank {rank} of 2, torch {torch.__version__}, 1 thread(s)", mine[:1]
        assert mine.count(f"Rank  {rank}  has data  1.0") == 2, mine  # blocking, then non-blocking
        assert f"Rank  {rank}  has data  2.0" in mine, mine  # all_reduce on new_group([0, 1])
        (ring,) = [m for line in mine
                   if (m := re.fullmatch(r"Rank  \d  ring all-reduce  (.+)  all_reduce  (.+)", line))]
        assert ring[1] == ring[2], ring[0]  # the hand-written ring sums as dist.all_reduce does
        assert sum(f"Rank  {rank} , epoch " in line for line in mine) == 10, mine
        assert f"Finished running DDP checkpoint example on rank {rank}." in mine, mine
        assert sum(f"rank {rank} loss " in line for line in mine) == 10, mine

    def alike(pattern: str) -> None:  # a value that every rank must hold equally (the same weights)
        found = [[m[1] for line in lines[r] if (m := re.match(pattern.format(rank=r), line))] for r in (0, 1)]
        assert found[0] and found[0] == found[1], (pattern, found)

    alike(r"Rank  {rank}  ring all-reduce  (.+)$")
    alike(r"Rank  {rank}  weights  (.+)$")  # synchronous SGD
    alike(r"rank {rank} weights (.+)$")  # demo_basic and demo_checkpoint
    alike(r"rank {rank} loaded (.+)$")  # rank 0's checkpoint
    alike(r"rank {rank} shard .* full (.+)$")  # FSDP2's parameters, gathered


def _equal(notebook: dict[int, list[str]], torchrun: dict[int, list[str]]) -> None:
    assert sorted(notebook) == [0, 1]
    for rank in (0, 1):
        assert notebook[rank] == torchrun[rank], f"rank {rank}: the notebook's lines differ from torchrun's"


def test_the_notebook_is_the_generators_output_from_the_script(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(FOLDER / "make_notebook.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, text=True)
    assert (tmp_path / NOTEBOOK.name).read_text(encoding="utf-8") == as_generated(NOTEBOOK), (
        "tutorials.ipynb is stale: run python examples/tutorials/make_notebook.py, then examples/execute.py")


@pytest.mark.timeout(400)
def test_the_tutorials_driven_from_one_notebook_give_torchruns_values_bit_for_bit(
        torchrun_lines: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # demo_checkpoint's file: the kernels inherit it
    _equal(notebook_values([NOTEBOOK], tmp_path, "--world-size", "2", "--spawn"), torchrun_lines)


@pytest.mark.timeout(400)
def test_the_tutorials_in_two_peer_notebooks_give_torchruns_values_bit_for_bit(
        torchrun_lines: dict[int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    _equal(notebook_values([NOTEBOOK], tmp_path, "--world-size", "2"), torchrun_lines)
