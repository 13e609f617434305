"""The pictures of the how-to "When a rank dies": a spawned worker killed in a cell, started again, and brought back.

A notebook driving a ``--spawn 2`` world is executed with nbclient. Rank 1 is killed with SIGKILL inside a
``%%collective`` (as the out-of-memory killer would): that cell ends naming how, and that it was restarted. Once
the new kernel joined, its first cell says that its namespace is new, and the ``NameError`` there names what it
lacks; ``%dist_replay`` and ``%dist_sync`` bring it back, and ``%dist_workers`` shows the exit. The executed
notebook is opened in JupyterLab under headless Chromium and each of those outputs saved, light and dark:

``rank-dies-killed.png``, ``rank-dies-new-kernel.png``, ``rank-dies-back.png``, ``rank-dies-workers.png``
(and ``-dark``). Needs the lab extra, Playwright's Python package and a system Chromium:

    python examples/what_you_see/make_restart_screenshots.py [--out DIR] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from make_debug_screenshots import _descendants, _reap
from make_screenshots import HERE, _free_port, lab_page, save_element
from nbclient import NotebookClient

SETUP = "%%collective\nimport math\nmodel = torch.nn.Linear(4, 2)\nsteps = 0\n"
TRAIN = ("%%collective\nloss = model(torch.ones(3, 4)).sum()\nloss.backward()\nfor p in model.parameters():\n"
         "    dist.all_reduce(p.grad)\nsteps += 1\n")
KILLED = ("%%collective\nimport os, signal\nx = torch.ones(1)\nif RANK == 1:\n"
          "    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would\ndist.all_reduce(x)\n")
WAIT = ("import time\nworkers = get_ipython().magics_manager.registry['DistMagics'].session.workers\n"
        "while not all(w.joined and w.alive() for w in workers.workers):\n    time.sleep(0.5)\n"
        "time.sleep(2)  # the new kernel follows\n")
AFTER = "%%collective\nprint(steps, model.weight.sum().item())\n"
BACK = "%dist_replay\n%dist_sync model steps\n"
# (stem, a text that picks the cell, whether it raises)
SHOWN = (("rank-dies-killed", "as the out-of-memory killer would", True),
         ("rank-dies-new-kernel", "print(steps", True),
         ("rank-dies-back", "%dist_replay", False),
         ("rank-dies-workers", "%dist_workers", False))


def execute(folder: Path) -> Path:
    """Run the notebook with nbclient; the cells that fail are tagged raises-exception, so the run goes on."""
    nb = nbformat.v4.new_notebook()

    def cell(source: str, raises: bool = False) -> Any:
        c = nbformat.v4.new_code_cell(source)
        if raises:
            c.metadata["tags"] = ["raises-exception"]
        return c

    nb.cells = [cell("%load_ext nbdist"), cell(f"%dist_init --spawn 2 --master-port {_free_port()}"), cell(SETUP),
                cell(TRAIN), cell("import time\ntime.sleep(2)  # a while later (the supervisor samples memory)"),
                cell(KILLED, True), cell(WAIT), cell(AFTER, True), cell(BACK), cell(AFTER.replace(
                    "print(", "print('again', ")), cell("%dist_workers")]
    started: set[int] = set()

    def seen(**_: Any) -> None:  # after each cell: the kernel, its workers and their helpers so far
        started.update(_descendants(os.getpid()))

    client = NotebookClient(nb, timeout=300, kernel_name="python3", on_cell_executed=seen,
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    finally:
        _reap(started)
    path = folder / "rank-dies.ipynb"
    nbformat.write(nb, path)
    return path


def screenshot(folder: Path, out: Path, chromium: str, theme: str) -> None:
    with lab_page(folder, "rank-dies.ipynb", chromium, theme) as page:
        page.set_viewport_size({"width": 1300, "height": 1600})
        page.wait_for_timeout(1000)
        for stem, text, _ in SHOWN:
            cell = page.locator(".jp-CodeCell").filter(has_text=text).last
            save_element(page, cell.locator(".jp-Cell-outputWrapper"), out, stem, theme)


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
    sys.exit(main())
