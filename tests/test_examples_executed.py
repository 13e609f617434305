"""The example notebooks carry their outputs, from examples/execute.py, stamped with the cells they ran (no kernel)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "execute.py"
_spec = importlib.util.spec_from_file_location("examples_execute", SCRIPT)
execute = sys.modules["examples_execute"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(execute)
NOTEBOOKS = [p for run in execute.runs() for p in run.notebooks]


def _check(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)


def test_every_example_notebook_is_executed() -> None:
    assert sorted(p.relative_to(ROOT).as_posix() for p in NOTEBOOKS) == sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*/*.ipynb"))
    done = _check(SCRIPT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_stamp_matches_the_cells_and_every_collective_cell_shows_its_table(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    stamp = nb.metadata["nbdist"]["executed"]
    assert stamp["sources"] == execute.sources_hash(nb), f"{path.name}: run python examples/execute.py"
    assert stamp["command"].startswith("nbdist run ") and stamp["nbdist"] and stamp["torch"] and stamp["date"]
    collectives = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%collective")]
    assert collectives
    for cell in collectives:
        assert cell.outputs and cell.execution_count, (path.name, cell.id)
        assert any("text/html" in o.get("data", {}) for o in cell.outputs), (path.name, cell.id)
    assert not any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)


def test_each_of_the_two_notebooks_shows_its_own_ranks_outputs() -> None:
    for rank in (0, 1):
        nb = nbformat.read(ROOT / "examples" / "two_notebooks" / f"rank{rank}.ipynb", as_version=4)
        (init,) = [c for c in nb.cells if c.get("id") == "dist-init"]
        world = "".join(o.get("data", {}).get("text/plain", "") for o in init.outputs)
        assert f"this notebook is rank {rank}" in world, world


def test_check_names_the_notebook_whose_cell_was_edited_and_only_it(tmp_path: Path) -> None:
    copy = tmp_path / "examples"
    copy.mkdir()
    shutil.copy(SCRIPT, copy / "execute.py")
    for path in NOTEBOOKS:
        target = copy / path.relative_to(ROOT / "examples")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    assert _check(copy / "execute.py").returncode == 0

    edited = copy / "course" / "2_collectives.ipynb"
    nb = nbformat.read(edited, as_version=4)
    (cell,) = [c for c in nb.cells if c.get("id") == "broadcast"]
    cell.source += "\nprint('edited')"
    nbformat.write(nb, edited)
    done = _check(copy / "execute.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "examples/course/2_collectives.ipynb: its cells changed since it was executed: "
        "run python examples/execute.py examples/course/2_collectives.ipynb"]

    gone = copy / "two_notebooks" / "rank1.ipynb"
    nb = nbformat.read(gone, as_version=4)
    del nb.metadata["nbdist"]
    nbformat.write(nb, gone)
    flagged = [line.split(":")[0] for line in _check(copy / "execute.py").stdout.splitlines()]
    assert flagged == ["examples/course/2_collectives.ipynb", "examples/two_notebooks/rank1.ipynb"]
