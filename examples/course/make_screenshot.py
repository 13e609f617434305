"""The README's "Learn collectives" picture: the all_gather table of the collectives lesson, in JupyterLab.

Executes 2_collectives.ipynb driven from one kernel (SPAWN = 4: three worker kernels follow it), opens the
executed notebook in JupyterLab under headless Chromium, and saves the all_gather cell's table as a PNG, in
the light theme and the dark one. Needs the lab extra, Playwright's Python package and a system Chromium:

    python examples/course/make_screenshot.py [--out DIR] [--chromium /usr/bin/chromium] [--ranks 4]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "what_you_see"))

from make_screenshots import _free_port, _settings  # noqa: E402

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
                    page.goto(f"http://127.0.0.1:{port}/lab/tree/2_collectives.ipynb", timeout=10_000)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            page.locator(".jp-OutputArea-output .nbdist").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            table = page.locator(".jp-OutputArea-output .nbdist").filter(has_text="after all_gather").first
            table.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            path = out / ("all_gather.png" if theme == "light" else f"all_gather-{theme}.png")
            table.screenshot(path=str(path))
            print(f"wrote {path}")
            browser.close()
            return path
    finally:
        lab.terminate()
        lab.wait(timeout=20)


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
