"""Screenshots for the README's "Many ranks": 8 and 16 ranks' grouped tables in JupyterLab, light and dark.

One notebook spawns the world (``%dist_init --spawn N``), runs a cell whose output splits the ranks by parity
and differs in its numbers, and one where a rank raises; then JupyterLab under headless Chromium shows it.
Needs the lab extra, Playwright's Python package and a system Chromium:

    python examples/what_you_see/make_many_ranks_screenshots.py [--out DIR] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import nbformat
from make_screenshots import HERE, lab_page, save_element
from nbclient import NotebookClient

CELL = ("%%collective\nprint('even' if RANK % 2 == 0 else 'odd')\n"
        "print(f'loss = {2.3 + RANK / 1000 + (0.2 if RANK == 5 else 0):.4f}')\n"
        "if RANK == 6:\n    raise ValueError('rank six is unwell')\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    for n in (8, 16):
        folder = Path(tempfile.mkdtemp())
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in ("%load_ext nbdist", f"%dist_init --spawn {n}", CELL)]
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True).execute()
        nbformat.write(nb, folder / "nb.ipynb")
        for theme in ("light", "dark"):
            with lab_page(folder, "nb.ipynb", args.chromium, theme) as page:
                table = page.locator(".jp-OutputArea-output .nbdist").filter(has_text="%%collective #1 ·").first
                save_element(page, table, args.out, f"many-ranks-{n}", theme)


if __name__ == "__main__":
    main()
