"""The course (examples/course/): the generator's output, cells that run both ways, and two lessons run for real.

CI runs every lesson through ``nbdist run`` on 2 and 4 ranks, as per-rank notebooks and with
``--spawn`` (examples/run_examples.sh); here the collectives and DDP lessons, run in one kernel that drives a
worker (``nbdist run --spawn``, once per session: tests/test_export.py compares the same runs with their
scripts), are checked cell by cell.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .conftest import as_generated
from .exported import EXACT

COURSE = Path(__file__).resolve().parents[1] / "examples" / "course"
LESSONS = sorted(COURSE.glob("*.ipynb"))


def test_the_course_has_a_notebook_per_topic_and_they_are_the_generators_output(tmp_path: Path) -> None:
    assert [p.name for p in LESSONS] == ["1_point_to_point.ipynb", "2_collectives.ipynb", "3_ddp.ipynb",
                                         "4_debugging.ipynb"]
    subprocess.run([sys.executable, str(COURSE / "make_course.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    for committed in LESSONS:
        assert (tmp_path / committed.name).read_text(encoding="utf-8") == as_generated(committed), (
            f"{committed.name} is stale: run python examples/course/make_course.py, then examples/execute.py"
        )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_rank_cell_is_a_collective_so_a_lesson_runs_per_rank_and_driven(path: Path) -> None:
    """Workers of a driving notebook run only %%collective cells (and %dist_barrier): a plain cell would run on
    rank 0 alone. The parameters cell is tagged for nbdist run and papermill."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    ids = [c.id for c in code]
    assert ids[:4] == ["load-ext", "parameters", "dist-init", "setup"] and ids[-2:] == ["barrier", "destroy"]
    assert code[1].metadata.get("tags") == ["parameters"]
    for cell in code[3:-2]:
        assert cell.source.startswith("%%collective"), (path.name, cell.id)
    checks = [c for c in code if c.id.endswith("-check") or c.id.startswith("after-")]
    assert checks and all("assert " in c.source for c in checks), path.name
    failing = [c.id for c in code if "raises-exception" in c.metadata.get("tags", [])]
    assert bool(failing) == (path.stem == "4_debugging"), failing


def test_every_primitive_of_the_collectives_lesson_draws_before_and_after_and_checks() -> None:
    nb = nbformat.read(COURSE / "2_collectives.ipynb", as_version=4)
    sources = {c.id: c.source for c in nb.cells if c.cell_type == "code"}
    for primitive in ("broadcast", "reduce", "all-reduce", "gather", "scatter", "all-gather", "reduce-scatter",
                      "all-to-all"):
        body = sources[primitive]
        assert body.count("nbdist.show(") >= 2, primitive
        assert f"{primitive}-check" in sources, primitive
    for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
        assert f'"{op}"' in sources["all-reduce"], op
    assert "dist.barrier()" in sources["barrier-demo"]


def _outputs_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text") or out.get("data", {}).get("text/plain", "") or out.get("evalue", ""))
    return "\n".join(parts)


@pytest.mark.timeout(300)  # the run itself, for the first test of the session that asks for it
def test_the_collectives_lesson_runs_driven_from_one_kernel_with_pictures_in_every_column(example_runs) -> None:
    nb = example_runs("2_collectives").notebook("2_collectives")
    cells = {c.id: c for c in nb.cells if c.cell_type == "code"}
    assert "this notebook drives its workers" in _outputs_text(cells["dist-init"])
    for check in [k for k in cells if k.endswith("-check")]:
        assert "ok" in _outputs_text(cells[check]), (check, _outputs_text(cells[check]))
    gathered = cells["all-gather"]
    html = "".join(o.get("data", {}).get("text/html", "") for o in gathered.outputs)
    # Every rank's "before" in its own column, coloured by its rank; "after" identical, shown once.
    assert html.count('title="rank 0"') >= 2 and html.count('title="rank 1"') >= 2, html[:2000]
    assert "identical on all 2 ranks" in html
    assert "skipped" not in _outputs_text(cells["all-reduce"])  # gloo on torch 2.13 has every ReduceOp asked for


@pytest.mark.timeout(300)
def test_the_ddp_lesson_driven_from_one_kernel_gives_plain_torchs_weights_bit_for_bit(example_runs) -> None:
    from nbdist.measure import plain_torch

    nb = example_runs("3_ddp").notebook("3_ddp")  # with a cell "exact" after steps-check, showing EXACT
    cells = {c.id: c for c in nb.cells if c.cell_type == "code"}
    assert "bit for bit" in _outputs_text(cells["steps-check"]), _outputs_text(cells["steps-check"])
    shown = "".join(o.get("data", {}).get("text/plain", "") for o in cells["exact"].outputs)
    assert "all 2 ranks (identical)" in shown, shown
    checksum = float(shown.rsplit("Out: ", 1)[1].split()[0])
    # The same cells in plain torch (two gloo processes, no nbdist), in this environment.
    body = "\n".join(cells[c].source.split("\n", 1)[1] for c in ("model", "grads", "steps"))
    (mine, other) = plain_torch.run("import nbdist\n" + body + f"\n_exact = {EXACT}\n", 2, ("_exact",))
    assert mine["_exact"] == other["_exact"] == checksum, (mine, other, checksum)
