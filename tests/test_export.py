"""``nbdist export``: a notebook and its exported script, run under torchrun, give every rank the same values.

Each example notebook runs through ``nbdist run`` (real kernels) and as its script under ``torchrun
--standalone`` (``nbdist export --run 2``); the per-rank printed lines, pictures and Out rows must be equal,
line for line, the DDP weight checksum included (tests/exported.py). The notebook runs are shared with
tests/test_examples.py and tests/test_course.py (the ``example_runs`` fixture).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .exported import EXAMPLES, script_values

COURSE = sorted((EXAMPLES / "course").glob("*.ipynb"))


def _equal(notebook: dict[int, list[str]], script: dict[int, list[str]], *expected: str) -> None:
    assert sorted(notebook) == sorted(script) == [0, 1]
    for rank in (0, 1):
        assert notebook[rank], f"rank {rank} showed nothing in the notebook"
        assert script[rank] == notebook[rank], f"rank {rank}"
    for text in expected:
        assert any(text in line for line in script[0]), (text, script[0])


@pytest.mark.timeout(300)
def test_the_one_notebook_walkthrough_gives_the_same_values_as_its_script_under_torchrun(example_runs) -> None:
    notebook = example_runs("walkthrough").values  # its own %dist_init --spawn 2
    script, _ = script_values(EXAMPLES / "one_notebook" / "walkthrough.ipynb")
    _equal(notebook, script, "AllReduce result: 1.0", "'weight checksum'", "'same weights': True")


@pytest.mark.timeout(300)
def test_the_two_notebooks_give_the_same_values_as_rank0s_script_with_rank_and_master_from_torchrun(
        example_runs) -> None:
    notebook = example_runs("two_notebooks").values
    # RANK = 0 in its body gives way to torchrun's RANK
    script, _ = script_values(EXAMPLES / "two_notebooks" / "rank0.ipynb")
    _equal(notebook, script, "[Rank 0] AllReduce result: 1.0", "'weight checksum'")
    assert any("[Rank 1]" in line for line in script[1])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lesson", COURSE, ids=lambda p: p.stem)
def test_every_course_lesson_gives_the_same_values_as_its_script(lesson: Path, example_runs) -> None:
    notebook = example_runs(lesson.stem).values  # nbdist run --world-size 2 --spawn
    script, _ = script_values(lesson)
    expected = {"3_ddp": ["weights: checksum", "gradient checksum"], "4_debugging": ["Out: 'the world still works'"],
                "2_collectives": ["all_reduce"], "1_point_to_point": [],
                "5_replicas": ["skipped step(s): [2]", "first weights"]}[lesson.stem]
    _equal(notebook, script, *expected)


def _notebook(tmp: Path, *cells: tuple[str, list[str]]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in cells]
    path = tmp / "job.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.timeout(120)
def test_a_parameter_is_a_flag_a_subset_cell_runs_on_its_ranks_and_a_picture_prints_its_text(tmp_path: Path) -> None:
    path = _notebook(
        tmp_path,
        ("%load_ext nbdist", []),
        ("epochs = 5\nname = 'adam'\nRANK = 0  # the launcher's, not a flag", ["parameters"]),
        ("%%dist_init --backend gloo --pg-timeout 30", []),
        ("%%collective\nt = torch.full((2,), float(epochs + RANK))\ndist.all_reduce(t)\nimport nbdist\n"
         "nbdist.show(t, 'summed', owner=False)\n(epochs, name, t.tolist())", []),
        ("%%collective --ranks 1\ntext = '''two\nlines'''\nprint(f'only rank {RANK}:', text.splitlines())", []),
        ("%%collective\nprint(dist.get_backend(), dist.get_world_size(), str(DEVICE), LOCAL_RANK)\nquiet = 1;", []),
        ("%dist_barrier\n%dist_status", []),
    )
    script, _ = script_values(path, 2, "--", "--epochs", "3")
    for rank in (0, 1):
        assert "Out: (3, 'adam', [7.0, 7.0])" in script[rank]
        assert any("summed" in line for line in script[rank]) and any("7" in line for line in script[rank])
        assert "gloo 2 cpu " + str(rank) in script[rank]
        assert not any(line.startswith("Out: 1") for line in script[rank])  # `quiet = 1;` shows nothing
    assert "only rank 1: ['two', 'lines']" in script[1]
    assert not any("only rank" in line for line in script[0])


def _export(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbdist", "export", *args], capture_output=True, text=True,
                          timeout=120)


def test_an_ipython_line_is_refused_with_its_cell_and_line_unless_allowed(tmp_path: Path) -> None:
    path = _notebook(tmp_path, ("%load_ext nbdist", []), ("%dist_init", []),
                     ("%%collective\nx = 1\n!nvidia-smi\nx", []))
    refused = _export(str(path), "-o", str(tmp_path / "job.py"))
    assert refused.returncode == 1
    assert "cell 3, line 3: '!nvidia-smi' has no script form" in refused.stderr and "--allow-ipython" in refused.stderr
    assert not (tmp_path / "job.py").exists()
    kept = _export(str(path), "-o", str(tmp_path / "job.py"), "--allow-ipython")
    assert kept.returncode == 0, kept.stderr
    text = (tmp_path / "job.py").read_text()
    assert "# !nvidia-smi  (IPython; left out)" in text and "nbdist.script.out(x)" in text
    compile(text, "job.py", "exec")


def test_a_missing_notebook_and_one_that_never_joins_are_clear_errors(tmp_path: Path) -> None:
    missing = _export(str(tmp_path / "nope.ipynb"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    never = _notebook(tmp_path, ("x = 1", []))
    result = _export(str(never))
    assert result.returncode == 1 and "never runs %%dist_init" in result.stderr
