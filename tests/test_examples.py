"""The example notebooks: they are the generator's output, and they run as two ranks of one world."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from nbdist.demo import plain_torch_checksum

from .conftest import as_generated, free_port, wait_gone

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_notebooks"
NOTEBOOKS = [EXAMPLE / "rank0.ipynb", EXAMPLE / "rank1.ipynb"]
CELL_TIMEOUT = 150  # seconds per cell; below the test's own timeout, so nbclient fails first and cleans up




def _cell(nb: nbformat.NotebookNode, cell_id: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in nb.cells if c.get("id") == cell_id]
    return cell


def test_notebooks_are_the_generators_output(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(EXAMPLE / "make_notebooks.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    for committed in NOTEBOOKS:
        assert (tmp_path / committed.name).read_text(encoding="utf-8") == as_generated(committed), (
            f"{committed.name} is stale: run python examples/two_notebooks/make_notebooks.py, then examples/execute.py"
        )


def test_notebooks_differ_only_in_the_configuration_area() -> None:
    nbs = [nbformat.read(p, as_version=4) for p in NOTEBOOKS]
    collectives = [[c.source for c in nb.cells if c.source.startswith("%%collective")] for nb in nbs]
    assert len(collectives[0]) == 4 and collectives[0] == collectives[1]
    differing = [a.id for a, b in zip(*(nb.cells for nb in nbs), strict=True) if a.source != b.source]
    assert differing == ["intro", "dist-init"]
    for rank, nb in enumerate(nbs):
        config = _cell(nb, "dist-init").source
        assert config.startswith("%%dist_init\n")
        assert re.search(rf"^RANK = {rank}\s", config, re.M)
        for line in ("WORLD_SIZE = 2", "MASTER_ADDR = '127.0.0.1'", "MASTER_PORT = 29500"):
            assert re.search(rf"^{re.escape(line)}\s", config, re.M), line


def _with_port(nb: nbformat.NotebookNode, port: int) -> nbformat.NotebookNode:
    cell = _cell(nb, "dist-init")
    cell.source, n = re.subn(r"^MASTER_PORT = 29500\b", f"MASTER_PORT = {port}", cell.source, flags=re.M)
    assert n == 1
    return nb


def _execute_both(nbs: list[nbformat.NotebookNode], cwd: Path, lag: float) -> None:
    """Run the notebooks at once with plain nbclient, one kernel each, as a user would in two JupyterLab tabs.

    Rank 1 lags ``lag`` seconds after each of its last cells, so rank 0, whose kernel hosts the rendezvous
    server, finishes first and shuts its kernel down while rank 1 still has cells to run.
    """
    errors: dict[int, BaseException] = {}
    (n_cells,) = {len(nb.cells) for nb in nbs}

    def lag_behind(cell, cell_index, execute_reply):  # nbclient hook, on rank 1 only
        if cell_index >= n_cells - 4:
            time.sleep(lag)

    def run(rank: int) -> None:
        client = NotebookClient(nbs[rank], timeout=CELL_TIMEOUT, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd)}},
                                on_cell_executed=lag_behind if rank == 1 else None)
        try:
            client.execute()
        except BaseException as exc:  # reported by the test's thread
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(len(nbs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:  # in the order they happened: the first is usually the cause of the others
        report = "\n\n".join(f"rank {rank}'s notebook failed: {exc}" for rank, exc in errors.items())
        raise AssertionError(report) from next(iter(errors.values()))


def _table(cell: nbformat.NotebookNode) -> str:
    """The text/plain of the side-by-side table a %%collective cell displayed."""
    texts = [o["data"]["text/plain"] for o in cell.outputs
             if o.output_type in ("display_data", "execute_result") and "text/plain" in o.get("data", {})]
    tables = [t for t in texts if t.startswith("%%collective #")]
    assert len(tables) == 1, texts
    return tables[0]


def _sections(table: str) -> dict[str, str]:
    """The table's text split at its '── heading ──' lines: heading -> text below it."""
    parts = re.split(r"^── (.+?) ──$", table, flags=re.M)
    return {heading: body for heading, body in zip(parts[1::2], parts[2::2], strict=True)}


# The DDP cell's Out: plain torch's checksum (computed here, in the same environment) and equal weights everywhere.
DDP_OUT = r"\{'epochs': 5, 'weight checksum': (-?\d+\.\d+(?:e-?\d+)?), 'same weights': True\}"


def _ddp_checksum(table: str) -> float:
    """The weight checksum the DDP cell's table shows (one Out for all ranks, checked by _check_table)."""
    match = re.search(r"^Out: " + DDP_OUT + "$", table, re.M)
    assert match, table
    return float(match[1])


def _check_table(table: str, world_size: int, own_line: str, out: str) -> None:
    """Every rank has a column with its own printed line; the Out row (a regex) is one value for all ranks."""
    sections = _sections(table)
    columns = {int(m[1]): body for h, body in sections.items() if (m := re.match(r"rank (\d+) ", h))}
    assert sorted(columns) == list(range(world_size)), table
    for rank, body in columns.items():
        assert own_line.format(rank=rank) in body, table
    identical = [body for h, body in sections.items() if "identical" in h]
    assert len(identical) == 1 and re.search(rf"^Out: {out}$", identical[0], re.M), table


@pytest.mark.timeout(240)
def test_both_notebooks_run_as_one_world(tmp_path: Path) -> None:
    port = free_port()  # never the real 29500
    nbs = [_with_port(nbformat.read(p, as_version=4), port) for p in NOTEBOOKS]
    _execute_both(nbs, tmp_path, lag=1.0)
    for nb in nbs:
        _check_table(_table(_cell(nb, "allreduce")), 2, "[Rank {rank}] AllReduce result: 1.0", r"1\.0")
        _check_table(_table(_cell(nb, "broadcast")), 2, "[Rank {rank}] after Broadcast: [42.0, 100.0, 256.0]",
                     re.escape("[42.0, 100.0, 256.0]"))
        _check_table(_table(_cell(nb, "allgather")), 2, "[Rank {rank}] AllGather result: [0.0, 10.0]",
                     re.escape("[0.0, 10.0]"))
        ddp = _table(_cell(nb, "ddp"))
        _check_table(ddp, 2, "[Rank {rank}] Epoch 5/5, Loss: ", DDP_OUT)
        assert _ddp_checksum(ddp) == plain_torch_checksum(2), ddp
        status = "".join(o.get("data", {}).get("text/plain", "") for o in _cell(nb, "status").outputs)
        assert status.startswith("nbdist status"), status
        destroyed = "".join(o.get("text", "") for o in _cell(nb, "destroy").outputs)
        assert "left the world" in destroyed, destroyed


# --- examples/one_notebook: the walkthrough driven from one notebook (%dist_init --spawn 2) ----------

ONE = Path(__file__).resolve().parents[1] / "examples" / "one_notebook"


def test_the_one_notebook_walkthrough_is_the_generators_output(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ONE / "make_notebook.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    committed = ONE / "walkthrough.ipynb"
    assert (tmp_path / committed.name).read_text(encoding="utf-8") == as_generated(committed), (
        "walkthrough.ipynb is stale: run python examples/one_notebook/make_notebook.py, then examples/execute.py"
    )
    two = [c.source for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells if c.source.startswith("%%collective")]
    one = [c.source for c in nbformat.read(committed, as_version=4).cells if c.source.startswith("%%collective")]
    assert one == two and len(one) == 4


@pytest.mark.timeout(300)
def test_the_one_notebook_walkthrough_runs_both_ranks_and_leaves_no_worker(example_runs) -> None:
    nb = example_runs("walkthrough").notebook("walkthrough")  # nbdist run, once per session (tests/exported.py)
    _check_table(_table(_cell(nb, "allreduce")), 2, "[Rank {rank}] AllReduce result: 1.0", r"1\.0")
    _check_table(_table(_cell(nb, "allgather")), 2, "[Rank {rank}] AllGather result: [0.0, 10.0]",
                 re.escape("[0.0, 10.0]"))
    ddp = _table(_cell(nb, "ddp"))
    _check_table(ddp, 2, "[Rank {rank}] Epoch 5/5, Loss: ", DDP_OUT)
    assert _ddp_checksum(ddp) == plain_torch_checksum(2), ddp
    workers = "".join(o.get("data", {}).get("text/plain", "") for o in _cell(nb, "workers").outputs)
    assert "rank 1" in workers and "pid:" in workers, workers
    pid = int(re.search(r"pid: (\d+)", workers)[1])
    barrier = "".join(o.get("text", "") for o in _cell(nb, "barrier").outputs)
    assert "all 2 ranks met" in barrier, barrier
    destroyed = "".join(o.get("text", "") for o in _cell(nb, "destroy").outputs)
    assert "left the world" in destroyed, destroyed
    wait_gone([pid], 15)
