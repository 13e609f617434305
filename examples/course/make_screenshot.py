"""The README's "Learn collectives" picture: the all_gather table of the collectives lesson, in JupyterLab.

Executes 2_collectives.ipynb driven from one kernel (SPAWN = 4: three worker kernels follow it), opens the
executed notebook in JupyterLab under headless Chromium, and saves the all_gather cell's table as a PNG, in
the light theme and the dark one. Needs the lab extra, Playwright's Python package and a system Chromium:

    python examples/course/make_screenshot.py [--out DIR] [--chromium /usr/bin/chromium] [--ranks 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "what_you_see"))

from make_screenshots import _free_port, lab_page, save_element  # noqa: E402

CELL = "all-gather"


def execute(folder: Path, ranks: int) -> Path:
    nb = nbformat.read(HERE / "2_collectives.ipynb", as_version=4)
    (params,) = [c for c in nb.cells if c.get("id") == "parameters"]
    params.source = params.source.replace("SPAWN = 2 ", f"SPAWN = {ranks} ")
    (init,) = [c for c in nb.cells if c.get("id") == "dist-init"]
    init.source = f"%%dist_init --master-port {_free_port()}"
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    path = folder / "2_collectives.ipynb"
    nbformat.write(nb, path)
    return path


def screenshot(folder: Path, out: Path, chromium: str, theme: str) -> Path:
    with lab_page(folder, "2_collectives.ipynb", chromium, theme) as page:
        table = page.locator(".jp-OutputArea-output .nbdist").filter(has_text="after all_gather").first
        return save_element(page, table, out, "all_gather", theme)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        execute(Path(tmp), args.ranks)
        for theme in ("light", "dark"):
            screenshot(Path(tmp), args.out, args.chromium, theme)


if __name__ == "__main__":
    main()
