"""DDP replicas agree bit for bit, and with plain torch: the walkthrough's training, driven 12 times under load.

A CI run once saw the walkthrough's two DDP replicas end with different weights (issue 25). Each run
here gathers every rank's weights and compares them element by element (``torch.equal``), and
compares the weight checksum with what plain torch computes in this environment (no nbdist), while
two busy loops compete with the kernels for the cores.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator

import pytest

from nbdist.demo import STEPS, plain_torch_checksum
from nbdist.drive import kernels

from .conftest import REAPER, free_port, ok

RUNS = 12
DDP = next(code for _, code, key in STEPS if key == "ddp")


@pytest.fixture
def busy() -> Iterator[None]:
    """Two processes that spin on the CPU for as long as the test runs (stopped by their pids)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait()


@pytest.mark.timeout(600)
def test_the_driven_ddp_cell_gives_equal_weights_on_every_rank_and_plain_torchs_12_times_under_load(busy):
    reference = plain_torch_checksum(2)
    k = kernels.Kernel()
    try:
        ok([k.execute("%load_ext nbdist", timeout=60)])
        ok([k.execute(f"%dist_init --spawn 2 --master-port {free_port()}", timeout=180)])
        seen = []
        for run in range(RUNS):
            r = k.execute("%%collective\n" + DDP, timeout=180, user_expressions={"v": "_nbdist_demo"})
            assert r.status == "ok", (run, r.error)
            epochs, checksum, identical = ast.literal_eval(r.expression("v"))
            seen.append((checksum, identical))
            assert identical, f"run {run}: the ranks' weights differ (torch.equal on the gathered weights): {seen}"
            assert epochs == 5 and checksum == reference, f"run {run}: {checksum!r}, plain torch {reference!r}"
        assert len(seen) == RUNS
    finally:
        REAPER.later([k])
