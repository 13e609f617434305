"""Screenshots for the README's "What you see": two ranks' tables in JupyterLab, in a real browser.

Runs two notebooks as the two ranks of one world (plain nbclient, one kernel each), then opens rank 0's
executed notebook in JupyterLab under headless Chromium and saves, for each table, a PNG of its output.
Needs the lab extra (`pip install -e '.[lab]'`), Playwright's Python package and a system Chromium:

    python examples/what_you_see/make_screenshots.py [--out DIR] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
CELLS = {
    "plots": (
        "%%collective\n"
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(2.4, 1.4))\n"
        "plt.plot([0, 1], [0, RANK], marker='o')\n"
        "plt.title(f'rank {RANK}')\n"
        "plt.show()\n"
        "print('plotted')\n"
    ),
    "dataframe": (
        "%%collective\n"
        "import pandas as pd\n"
        "t = torch.arange(3.0) + 10 * RANK\n"
        "before = t.tolist()\n"
        "print('before:', before)\n"
        "dist.all_reduce(t)\n"
        "print('after:', t.tolist())\n"
        "pd.DataFrame({'mine': before, 'sum': t.tolist()}).rename_axis('element')\n"
    ),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook(rank: int, port: int) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext nbdist"),
        nbformat.v4.new_code_cell(f"%%dist_init --rank {rank} --world-size 2 --master-addr 127.0.0.1 "
                                  f"--master-port {port}"),
        *(nbformat.v4.new_code_cell(code, id=name) for name, code in CELLS.items()),
        nbformat.v4.new_code_cell("%dist_barrier"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(folder: Path) -> None:
    port = _free_port()
    nbs = [notebook(rank, port) for rank in range(2)]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            NotebookClient(nbs[rank], timeout=120, kernel_name="python3").execute()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a notebook failed: {errors[0]}")
    for rank, nb in enumerate(nbs):
        nbformat.write(nb, folder / f"rank{rank}.ipynb")


def _settings(folder: Path, theme: str) -> Path:
    """A user-settings folder: no news pop-up over the page, and the theme asked for."""
    settings = folder / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    name = "JupyterLab Dark" if theme == "dark" else "JupyterLab Light"
    (settings / "themes.jupyterlab-settings").write_text(f'{{"theme": "{name}"}}')
    return folder / "settings"


@contextlib.contextmanager
def lab_page(folder: Path, notebook: str, chromium: str, theme: str) -> Iterator[Any]:
    """JupyterLab on loopback with ``folder`` as its root, and a headless Chromium page showing ``notebook``."""
    from playwright.sync_api import sync_playwright

    port = _free_port()
    lab = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
                            "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", f"--ServerApp.root_dir={folder}",
                            "--ServerApp.disable_check_xsrf=True", "--allow-root",
                            f"--LabApp.user_settings_dir={_settings(folder, theme)}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=flags)
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            deadline = time.monotonic() + 60
            while True:
                try:
                    page.goto(f"http://127.0.0.1:{port}/lab/tree/{notebook}", timeout=10_000)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            page.locator(".jp-OutputArea-output .nbdist").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            yield page
            browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=20)


def save_element(page: Any, element: Any, out: Path, stem: str, theme: str) -> Path:
    """Screenshot one element of ``page`` as ``out/stem.png`` (``stem-dark.png`` in the dark theme)."""
    element.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    path = out / (f"{stem}.png" if theme == "light" else f"{stem}-{theme}.png")
    element.screenshot(path=str(path))
    print(f"wrote {path}")
    return path


def screenshot(folder: Path, out: Path, chromium: str, theme: str = "light") -> None:
    with lab_page(folder, "rank0.ipynb", chromium, theme) as page:
        tables = page.locator(".jp-OutputArea-output .nbdist")
        for i, name in enumerate(CELLS, 1):  # the cells' tables are %%collective #1, #2...
            table = tables.filter(has_text=f"%%collective #{i} ·").first
            table.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            path = out / (f"{name}.png" if theme == "light" else f"{name}-{theme}.png")
            table.screenshot(path=str(path))
            print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--theme", choices=("light", "dark", "both"), default="light",
                        help="JupyterLab's theme (default light; the dark ones are saved as NAME-dark.png)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        execute(Path(tmp))
        for theme in ("light", "dark") if args.theme == "both" else (args.theme,):
            screenshot(Path(tmp), args.out, args.chromium, theme)


if __name__ == "__main__":
    main()
