"""Run every example notebook through ``nbdist run`` and keep its outputs in the notebook, stamped.

    python examples/execute.py [--check] [NOTEBOOK ...]

Each example runs on 2 ranks as examples/run_examples.sh runs it: the two notebooks as two ranks,
the walkthrough alone (its ``%dist_init --spawn 2`` starts rank 1), each lesson and PyTorch's
tutorials driven from one notebook (``--world-size 2 --spawn``, as their ``SPAWN = 2`` does in
JupyterLab). The outputs and execution counts of each cell are copied into the notebook here
(rank1.ipynb takes rank 1's, every other notebook rank 0's), and ``metadata["nbdist"]["executed"]``
records the hash of the cells it ran, the command, the date and the versions. ``--check`` runs
nothing: it names every notebook whose stamp is missing or no longer matches its cells (a cell edited
since), and exits 1 if there is one. The generators (make_notebooks.py, make_notebook.py,
make_course.py, tutorials/make_notebook.py) write notebooks without outputs: run this script after
them. tests/test_examples_executed.py checks the stamps.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # this checkout's nbdist, installed or not

from nbdist import __version__  # noqa: E402

INJECTED = "injected-parameters"  # the tag of the cell nbdist run adds


@dataclass(frozen=True)
class Run:
    """One ``nbdist run``: notebook i of ``notebooks`` takes the outputs of rank i (of rank 0 if it is alone)."""

    notebooks: tuple[Path, ...]
    args: tuple[str, ...] = ()

    def command(self) -> list[str]:
        return ["nbdist", "run", *(str(p.relative_to(ROOT)) for p in self.notebooks), *self.args]


def runs() -> list[Run]:
    """Every example notebook, in the order run_examples.sh runs them."""
    two = HERE / "two_notebooks"
    return [
        Run((two / "rank0.ipynb", two / "rank1.ipynb")),
        Run((HERE / "one_notebook" / "walkthrough.ipynb",)),
        *(Run((lesson,), ("--world-size", "2", "--spawn")) for lesson in sorted((HERE / "course").glob("*.ipynb"))),
        Run((HERE / "tutorials" / "tutorials.ipynb",), ("--world-size", "2", "--spawn")),
    ]


def sources_hash(nb: nbformat.NotebookNode) -> str:
    """The sha256 of the cells' types and sources, in order: what the stamp says was run."""
    cells = [[c.cell_type, c.source] for c in nb.cells]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def stale(path: Path) -> str | None:
    """Why the notebook at ``path`` needs running again, or None when its stamp matches its cells."""
    nb = nbformat.read(path, as_version=4)
    stamp = nb.metadata.get("nbdist", {}).get("executed")
    if not stamp:
        return "no outputs stamp"
    if stamp.get("sources") != sources_hash(nb):
        return "its cells changed since it was executed"
    return None


def copy_outputs(executed: nbformat.NotebookNode, into: nbformat.NotebookNode) -> None:
    """Each code cell of ``into`` takes the outputs and execution count of its cell in ``executed``
    (the same id, else the same source); the injected cell is left out."""
    ran = [c for c in executed.cells if INJECTED not in c.metadata.get("tags", [])]
    by_id = {c.get("id"): c for c in ran if c.get("id")}
    by_source = {c.source: c for c in ran}
    for cell in into.cells:
        if cell.cell_type != "code":
            continue
        match = by_id.get(cell.get("id")) or by_source.get(cell.source)
        if match is None or match.source != cell.source:
            raise SystemExit(f"execute.py: no executed cell matches cell {cell.get('id')!r}")
        cell.outputs = match.outputs
        cell.execution_count = match.execution_count


def execute(run: Run) -> None:
    """Run ``run`` in a temporary folder and write its outputs, stamped, into its notebooks."""
    command = run.command()
    with tempfile.TemporaryDirectory(prefix="nbdist-examples-") as out:
        print("+", " ".join(command), flush=True)
        done = subprocess.run([sys.executable, "-m", *command, "--out", out], cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"execute.py: {' '.join(command)} exited {done.returncode}; notebooks left as they were")
        stamp = {
            "command": " ".join(command),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "nbdist": __version__,
            "torch": importlib.metadata.version("torch"),
        }
        for rank, path in enumerate(run.notebooks):
            nb = nbformat.read(path, as_version=4)
            copy_outputs(nbformat.read(Path(out) / f"{path.stem}.rank{rank}.ipynb", as_version=4), nb)
            nb.metadata.setdefault("nbdist", {})["executed"] = {"sources": sources_hash(nb), **stamp}
            nbformat.validate(nb)
            path.write_text(nbformat.writes(nb, version=4), encoding="utf-8", newline="\n")
            print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="run nothing; exit 1 naming every notebook whose outputs stamp is missing or stale")
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="NOTEBOOK",
                        help="example notebooks (default: all); a two-notebook example runs whole")
    args = parser.parse_args(argv)
    chosen = {p.resolve() for p in args.notebooks}
    known = {p for run in runs() for p in run.notebooks}
    if chosen - known:
        parser.error(f"not an example notebook: {', '.join(map(str, sorted(chosen - known)))}")
    if args.check:
        reasons = {p: stale(p) for p in sorted(chosen or known)}
        for path, why in reasons.items():
            if why:
                print(f"{path.relative_to(ROOT)}: {why}: run python examples/execute.py {path.relative_to(ROOT)}")
        return 1 if any(reasons.values()) else 0
    started = time.monotonic()
    for run in runs():
        if not chosen or chosen & set(run.notebooks):
            execute(run)
    print(f"execute.py: done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
