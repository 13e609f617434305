"""The how-to's picture for "When replicas differ": ``--find-divergence`` naming a dropout seeded by rank, 4 ranks.

Executes the course's fifth lesson (``examples/course/5_replicas.ipynb``) driven from one kernel with ``SPAWN = 4``
(three worker kernels follow it) with nbclient, opens the executed notebook in JupyterLab under headless
Chromium, and saves its ``dropout-find`` cell, code and table (``%%collective --find-divergence``: the ranks part
ways at the dropout's ``aten.bernoulli_``, on the line that calls the model) as ``replicas-find-divergence-4.png``,
in the light theme and the dark one (``-dark.png``). Needs the lab extra, Playwright's Python package and a
system Chromium:

    python examples/what_you_see/make_replicas_screenshots.py [--out DIR] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from make_debug_screenshots import _descendants, _reap
from make_screenshots import HERE, _free_port, lab_page, save_element
from nbclient import NotebookClient

LESSON = HERE.parent / "course" / "5_replicas.ipynb"
CELL = "dropout-find"
STEM = "replicas-find-divergence-4"


def execute(folder: Path, ranks: int = 4) -> Path:
    """The lesson driven at ``ranks`` ranks, with its outputs, written into ``folder`` (its failing cell is tagged
    raises-exception, so the run goes on); every process it started is gone on return."""
    nb = nbformat.read(LESSON, as_version=4)
    (params,) = [c for c in nb.cells if c.get("id") == "parameters"]
    params.source = params.source.replace("SPAWN = 2 ", f"SPAWN = {ranks} ")
    (init,) = [c for c in nb.cells if c.get("id") == "dist-init"]
    init.source = f"%%dist_init --master-port {_free_port()}"
    started: set[int] = set()

    def seen(**_: Any) -> None:  # after each cell: the kernel, its workers and their helpers so far
        started.update(_descendants(os.getpid()))

    client = NotebookClient(nb, timeout=300, kernel_name="python3", on_cell_executed=seen,
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    finally:
        _reap(started)
    (found,) = [c for c in nb.cells if c.get("id") == CELL]
    text = "".join(o.get("data", {}).get("text/plain", "") for o in found.outputs)
    if "aten.bernoulli_" not in text:
        raise SystemExit(f"the {CELL} cell did not name the dropout:\n{text}")
    path = folder / LESSON.name
    nbformat.write(nb, path)
    return path


def screenshot(folder: Path, out: Path, chromium: str, theme: str) -> Path:
    # every cell kept in the page (JupyterLab renders only the cells in view by default), with line numbers: the
    # answer names the cell's lines
    tracker = folder / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"windowingMode": "none", "codeCellConfig": {"lineNumbers": true}}')
    with lab_page(folder, LESSON.name, chromium, theme) as page:
        page.set_viewport_size({"width": 1600, "height": 1400})  # the answer's lines unbroken in the table
        page.wait_for_timeout(1000)
        cell = page.locator(".jp-CodeCell").filter(has_text="part ways at operation").first  # its code and table
        return save_element(page, cell, out, STEM, theme)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        execute(Path(tmp))
        for theme in ("light", "dark"):
            screenshot(Path(tmp), args.out, args.chromium, theme)


if __name__ == "__main__":
    main()
