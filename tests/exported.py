"""Per-rank values of a notebook run (``nbdist run``) and of its exported script run (``nbdist export --run``).

A notebook's values are read from the cells' own captures: after each ``%%collective`` cell a plain cell
(added to a copy of the notebook) stores every rank's printed lines, displays' text and Out row, as the
cell's table holds them; the script's values are its ``[rank k]`` lines on stdout. Both are lists of lines
per rank, in order: what the two must agree on.

:func:`example_run` runs an example notebook once per test session (the ``example_runs`` fixture): the
export tests compare its values, and tests/test_examples.py and tests/test_course.py check the executed
notebooks it leaves, rather than each running the same notebook again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .conftest import free_port

_SETUP = '''_nbdist_values = []


def _nbdist_texts(capture):
    lines = []
    for out in [] if capture is None else capture.outputs:
        if out["kind"] == "stdout":
            lines += out["text"].splitlines()
        elif out["kind"] == "display":
            lines += out["data"].get("text/plain", "").splitlines()
    result = (None if capture is None else capture.result) or {}
    if result.get("text/plain"):
        text = result["text/plain"].splitlines()
        lines += [f"Out: {text[0]}", *text[1:]]
    return lines
'''
_RECORD = '''import nbdist.magics as _nbdist_magics
_nbdist_values.append([_nbdist_texts(c) for c in _nbdist_magics.registered().last_outcome.captures])
'''
_WRITE = '''import json as _nbdist_json
with open({path!r} + f".{{RANK}}.json", "w") as _nbdist_file:
    _nbdist_json.dump(_nbdist_values, _nbdist_file)
'''
_MARK = re.compile(r"^\[rank (\d+)\] (.*)$")


def _kept(cell: nbformat.NotebookNode) -> bool:
    return not {"raises-exception", "nbdist-skip"} & set(cell.metadata.get("tags", []))


def recording_copy(path: Path, out: Path, values: Path, after: dict[str, tuple[str, str]] | None = None) -> Path:
    """A copy of notebook ``path`` in ``out`` that writes each kept cell's per-rank lines to ``values.RANK.json``.

    ``after`` maps a cell's id to a cell (id, source) added after it, tagged ``nbdist-skip``: run, not recorded
    (a check of a test's own, which the exported script does not have).
    """
    nb = nbformat.read(path, as_version=4)
    cells = [nbformat.v4.new_code_cell(_SETUP)]
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "code" and cell.source.startswith("%%collective") and _kept(cell):
            cells.append(nbformat.v4.new_code_cell(_RECORD))
        if cell.get("id") in (after or {}):
            added_id, source = (after or {})[cell.id]
            cells.append(nbformat.v4.new_code_cell(source, id=added_id, metadata={"tags": ["nbdist-skip"]}))
    cells.append(nbformat.v4.new_code_cell(_WRITE.format(path=str(values))))
    nb.cells = cells
    copy = out / path.name
    nbformat.write(nb, copy)
    return copy


def notebook_values(paths: list[Path], tmp: Path, *flags: str,
                    after: dict[str, tuple[str, str]] | None = None) -> dict[int, list[str]]:
    """Each rank's lines over the kept ``%%collective`` cells of ``paths`` run by ``nbdist run FLAGS``; the
    executed notebooks are left in ``tmp / "executed"``."""
    copies = tmp / "copies"
    copies.mkdir(exist_ok=True)
    values = tmp / "values"
    run = [sys.executable, "-m", "nbdist", "run", *(str(recording_copy(p, copies, values, after)) for p in paths),
           "--out", str(tmp / "executed"), "--master-port", str(free_port()), *flags]
    done = subprocess.run(run, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbdist run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    cells = json.loads(Path(f"{values}.0.json").read_text())
    return {rank: [line for cell in cells for line in cell[rank]] for rank in range(len(cells[0]))}


def script_values(path: Path, nproc: int = 2, *args: str) -> tuple[dict[int, list[str]], str]:
    """Each rank's ``[rank k]`` lines on stdout of ``nbdist export PATH --run NPROC``, and its stderr."""
    done = subprocess.run([sys.executable, "-m", "nbdist", "export", str(path), "--run", str(nproc), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the exported script failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    per_rank: dict[int, list[str]] = {r: [] for r in range(nproc)}
    for line in done.stdout.splitlines():
        match = _MARK.match(line)
        if match:
            per_rank[int(match[1])].append(match[2])
    return per_rank, done.stderr


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# The DDP lesson's weights, summed exactly: a cell added after its steps-check (tests/test_course.py reads it).
EXACT = "sum(p.detach().double().sum().item() for p in model.parameters())"


@dataclass(frozen=True)
class ExampleRun:
    """One ``nbdist run`` of an example: each rank's recorded lines, and the folder of executed notebooks."""

    values: dict[int, list[str]]
    executed: Path

    def notebook(self, name: str, rank: int = 0) -> nbformat.NotebookNode:
        """The executed copy of notebook ``name`` (its stem) as rank ``rank`` ran it."""
        return nbformat.read(self.executed / f"{name}.rank{rank}.ipynb", as_version=4)


def example_run(name: str, tmp: Path) -> ExampleRun:
    """Run example ``name`` through ``nbdist run``: ``walkthrough`` (its own ``%dist_init --spawn 2``),
    ``two_notebooks`` (a notebook per rank), or a course lesson's stem (``--world-size 2 --spawn``)."""
    if name == "walkthrough":
        paths, flags, after = [EXAMPLES / "one_notebook" / "walkthrough.ipynb"], (), None
    elif name == "two_notebooks":
        paths, flags, after = [EXAMPLES / "two_notebooks" / f"rank{i}.ipynb" for i in (0, 1)], (), None
    else:
        paths, flags = [EXAMPLES / "course" / f"{name}.ipynb"], ("--world-size", "2", "--spawn")
        after = {"steps-check": ("exact", f"%%collective\n{EXACT}")} if name == "3_ddp" else None
    values = notebook_values(paths, tmp, *flags, after=after)
    return ExampleRun(values, tmp / "executed")
