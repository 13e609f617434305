"""The course (examples/course/): the generator's output, cells that run both ways, and three lessons run for real.

CI runs every lesson through ``nbdist run`` on 2 and 4 ranks, as per-rank notebooks and with
``--spawn`` (examples/run_examples.sh); here the collectives, DDP and replicas lessons, run in one kernel that
drives a worker (``nbdist run --spawn``, once per session: tests/test_export.py compares the same runs with their
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
                                         "4_debugging.ipynb", "5_replicas.ipynb"]
    subprocess.run([sys.executable, str(COURSE / "make_course.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    for committed in LESSONS:
        assert (tmp_path / committed.name).read_text(encoding="utf-8") == as_generated(committed), (
            f"{committed.name} is stale: run python examples/course/make_course.py, then examples/execute.py"
        )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_rank_cell_is_a_collective_so_a_lesson_runs_per_rank_and_driven(path: Path) -> None:
    """Workers of a driving notebook run only %%collective cells (and %dist_barrier): a plain cell would run on
    rank 0 alone. %dist_compare runs as a %%collective of its own (and in every notebook of a peer world). The
    parameters cell is tagged for nbdist run and papermill."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    ids = [c.id for c in code]
    assert ids[:4] == ["load-ext", "parameters", "dist-init", "setup"] and ids[-2:] == ["barrier", "destroy"]
    assert code[1].metadata.get("tags") == ["parameters"]
    for cell in code[3:-2]:
        assert cell.source.startswith(("%%collective", "%dist_compare ")), (path.name, cell.id)
    checks = [c for c in code if c.id.endswith("-check") or c.id.startswith("after-")]
    assert checks and all("assert " in c.source for c in checks), path.name
    failing = [c.id for c in code if "raises-exception" in c.metadata.get("tags", [])]
    assert bool(failing) == (path.stem in ("4_debugging", "5_replicas")), failing
    # What a script cannot run or show is tagged so that nbdist export leaves it out.
    for cell in code:
        if cell.source.startswith("%dist_compare") or "--find-divergence" in cell.source.split("\n", 1)[0]:
            assert "nbdist-skip" in cell.metadata.get("tags", []), (path.name, cell.id)


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


def test_each_way_replicas_part_is_shown_found_and_fixed_with_a_check() -> None:
    nb = nbformat.read(COURSE / "5_replicas.ipynb", as_version=4)
    sources = {c.id: c.source for c in nb.cells if c.cell_type == "code"}
    for bug in ("dropout", "skip", "seed"):
        assert bug in sources and f"{bug}-fixed" in sources and f"{bug}-check" in sources, bug
        found = [k for k in sources if k.startswith(f"{bug}-") and k.endswith(("-compare", "-find", "-found"))]
        assert found, bug
    assert "torch.manual_seed(RANK)" in sources["dropout"] and "nn.Dropout" in sources["model"]
    assert sources["dropout-find"].startswith("%%collective --find-divergence\n")
    assert "%dist_compare model --rng" == sources["seed-compare"]
    assert "nbdist.check_replicas(model" in sources["skip-found"]
    assert "nbdist.check_replicas" in sources["dropout-fixed"]


@pytest.mark.timeout(300)
def test_the_replicas_lesson_driven_from_one_kernel_names_the_dropout_the_parted_weights_and_the_generators(
        example_runs) -> None:
    nb = example_runs("5_replicas").notebook("5_replicas")
    cells = {c.id: c for c in nb.cells if c.cell_type == "code"}
    for check in [k for k in cells if k.endswith("-check")]:
        assert "the same weights on every rank" in _outputs_text(cells[check]), (check, _outputs_text(cells[check]))
    found = _outputs_text(cells["dropout-find"])
    # the dropout's mask, on the line that calls the model; every operation before it agreed
    assert "ranks 0,1 part ways at operation #" in found and ", line 5: aten.bernoulli_" in found, found
    assert found.count("find-divergence:") == 1, found
    compared = _outputs_text(cells["dropout-compare"])
    assert "model: differs: 2 groups, rank 0 · rank 1" in compared and "the first: 0.weight" in compared, compared
    failed = _outputs_text(cells["skip"])
    assert "CollectiveMismatchError" in failed and "issued #9 (all_reduce)" in failed, failed
    caught = _outputs_text(cells["skip-found"])
    assert "the replicas differ at step 1: 0.weight differs" in caught and "rank 0 · rank 1" in caught, caught
    assert "skipped step(s): [2]" in _outputs_text(cells["skip-fixed"])
    rng = _outputs_text(cells["seed-compare"])
    assert "torch: states differ: rank 0 · rank 1" in rng and "the first: 0.weight" in rng, rng
