"""The README's timeline picture: a ``%%collective --trace`` cell on 3 ranks, in JupyterLab.

Executes a small notebook driven from one kernel (``%dist_init --spawn 3``: two worker kernels follow
it) whose traced cell has rank 2 arrive late at its third all_reduce, opens the executed notebook in
JupyterLab under headless Chromium, and saves the cell's output (the table, then the timeline) as a PNG,
in the light theme and the dark one. Needs the lab extra, Playwright's Python package and a system
Chromium:

    python examples/what_you_see/make_trace_screenshot.py [--out DIR] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import nbformat
from make_screenshots import _free_port, lab_page, save_element
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
TRACED = (
    "%%collective --trace\n"
    "import time\n"
    "t = torch.ones(1 << 16)\n"
    "for step in range(4):\n"
    "    if step == 2 and RANK == 2:\n"
    "        time.sleep(0.8)  # rank 2 is late here\n"
    "    dist.all_reduce(t)\n"
    "dist.broadcast(t, src=0)\n"
    "print('done')\n"
)


def execute(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbdist"),
                nbformat.v4.new_code_cell(f"%dist_init --spawn 3 --master-port {_free_port()}"),
                nbformat.v4.new_code_cell(TRACED)]
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    path = folder / "trace.ipynb"
    nbformat.write(nb, path)
    return path


def screenshot(folder: Path, out: Path, chromium: str, theme: str) -> Path:
    with lab_page(folder, "trace.ipynb", chromium, theme) as page:
        cell = page.locator(".jp-CodeCell").filter(has_text="--trace").first
        return save_element(page, cell.locator(".jp-Cell-outputWrapper"), out, "trace", theme)


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
