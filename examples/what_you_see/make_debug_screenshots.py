"""The pictures of the how-to "Debug a hang": a hung cell's report at 8 ranks, and a breakpoint relayed from a rank.

``debug-hang-8.png`` (and ``-dark``): a notebook driving a ``--spawn 8`` world, executed with nbclient, whose
``%%collective --max-time 20`` cell has rank 7 sleep where the others run DDP's backward; the cell ends with
MaxTimeError and its grouped table ends with where every rank was (the merged stacks, then the Flight
Recorder's line). The executed notebook is opened in JupyterLab under headless Chromium and the cell's output
saved, in the light theme and the dark one.

``debug-relayed-prompt.png`` (and ``-dark``): a live session, since a debugger's prompt is an input request
that no notebook file keeps. JupyterLab runs a notebook driving a ``--spawn 2`` world whose cell stops rank 1
at ``breakpoint()``; the prompt opens in the driving notebook labelled with the rank, ``p x`` is typed into it,
and the cell's output (the live table, pdb's listing, the answer, the next prompt) is saved; then ``c`` lets
the cell end and everything is shut down. Needs the lab extra, Playwright's Python package and a system
Chromium:

    python examples/what_you_see/make_debug_screenshots.py [--out DIR] [--chromium /usr/bin/chromium]

``--only hang`` or ``--only prompt`` makes one of the two.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
from make_screenshots import HERE, _free_port, _settings, lab_page, save_element
from nbclient import NotebookClient

HANG = (
    "%%collective --max-time 20\n"
    "import time\n"
    "loss = model(torch.ones(3, 4)).sum()\n"
    "if RANK != 7:\n"
    "    loss.backward()\n"
    "else:\n"
    "    time.sleep(60)\n"
)
BREAKPOINT = (
    "%%collective --timeout 3\n"
    "x = torch.full((2,), 40.0 + RANK)\n"
    "if RANK == 1:\n"
    "    breakpoint()\n"
    "y = x * 10\n"
    "dist.all_reduce(x)\n"
    "print('done', RANK, x.tolist())\n"
)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


# --- processes: whatever was started here ends here, by pid -----------------

def _descendants(pid: int) -> set[int]:
    """The pids below ``pid`` (children, theirs, ...), read from /proc; empty where there is no /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _reap(pids: set[int], grace: float = 10.0) -> None:
    """Wait up to ``grace`` s for ``pids`` to end on their own, then kill those left."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.5)
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


# --- screenshot 1: the report of a hung cell at 8 ranks ---------------------

def execute_hang(folder: Path) -> Path:
    """Run the hang notebook with nbclient; its hung cell is tagged raises-exception, so the run goes on."""
    nb = nbformat.v4.new_notebook()
    hang = nbformat.v4.new_code_cell(HANG)
    hang.metadata["tags"] = ["raises-exception"]
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbdist"),
                nbformat.v4.new_code_cell(f"%dist_init --spawn 8 --master-port {_free_port()}"),
                nbformat.v4.new_code_cell("%%collective\n"
                                          "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"),
                hang]
    started: set[int] = set()

    def seen(**_: Any) -> None:  # after each cell: the kernel, its workers and their helpers so far
        started.update(_descendants(os.getpid()))

    client = NotebookClient(nb, timeout=300, kernel_name="python3", on_cell_executed=seen,
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute()
    finally:
        _reap(started)
    path = folder / "debug-hang.ipynb"
    nbformat.write(nb, path)
    out = nb.cells[-1].outputs
    text = json.dumps(out)
    if "where every rank was" not in text:
        print("warning: the hung cell's output has no report of where every rank was", file=sys.stderr)
    return path


def screenshot_hang(folder: Path, out: Path, chromium: str, theme: str) -> Path:
    with lab_page(folder, "debug-hang.ipynb", chromium, theme) as page:
        page.set_viewport_size({"width": 1600, "height": 2400})  # wide columns, and the whole output in view
        page.wait_for_timeout(1000)
        cell = page.locator(".jp-CodeCell").filter(has_text="--max-time 20").first
        return save_element(page, cell.locator(".jp-Cell-outputWrapper"), out, "debug-hang-8", theme)


# --- screenshot 2: a breakpoint on rank 1, answered in the driving notebook ---

def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not seen within {timeout:g} s")
        time.sleep(every)


@contextlib.contextmanager
def live_lab(folder: Path) -> Iterator[str]:
    """JupyterLab on loopback with ``folder`` as its root (every cell kept in the DOM, the app exposed to the
    page for the theme switch); yields its base URL, and on the way out stops it and all it started."""
    settings = _settings(folder.parent, "light")
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"windowingMode": "none"}')
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    lab = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}",
                            "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", f"--ServerApp.root_dir={folder}",
                            "--ServerApp.disable_check_xsrf=True", "--allow-root",
                            "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={settings}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    started: set[int] = set()
    try:
        wait_for("JupyterLab answering", lambda: _answers(f"{base}/api/status"), 60, every=0.5)
        yield base
    finally:
        started = _descendants(lab.pid)
        with contextlib.suppress(OSError, ValueError):  # shut the kernels down politely first
            with urllib.request.urlopen(f"{base}/api/kernels", timeout=5) as reply:
                for kernel in json.load(reply):
                    request = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}", method="DELETE")
                    urllib.request.urlopen(request, timeout=20).close()
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.kill()
            lab.wait(timeout=10)
        _reap(started)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except OSError:
        return False


def screenshot_prompt(folder: Path, out: Path, chromium: str) -> list[Path]:
    """Run the breakpoint notebook through JupyterLab's UI, answer rank 1's prompt with ``p x``, save the output."""
    from playwright.sync_api import sync_playwright

    root = folder / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbdist"),
                nbformat.v4.new_code_cell(f"%dist_init --spawn 2 --master-port {_free_port()}"),
                nbformat.v4.new_code_cell(BREAKPOINT)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "breakpoint.ipynb")
    saved: list[Path] = []
    with live_lab(root) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            page.goto(f"{base}/lab/tree/breakpoint.ipynb", timeout=60_000)
            notebook = page.locator(".jp-NotebookPanel").first
            notebook.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(timeout=120_000)
            notebook.locator(".jp-Cell").first.click()
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            cell = notebook.locator(".jp-CodeCell").filter(has_text="breakpoint()").first
            output = cell.locator(".jp-Cell-outputWrapper")
            answer = cell.locator(".jp-Stdin-input")
            answer.wait_for(timeout=180_000)
            wait_for("rank 1's labelled prompt", lambda: "ipdb>" in cell.locator(".jp-Stdin").last.inner_text(), 30)
            answer.fill("p x")
            answer.press("Enter")
            wait_for("the answer, then the next prompt",
                     lambda: "tensor([41., 41.])" in output.inner_text() and cell.locator(".jp-Stdin-input").count(),
                     30)
            with contextlib.suppress(SystemExit):  # the live table shows where rank 1 is, once it redraws
                wait_for("the live table at the debugger",
                         lambda: "in the debugger at cell line" in output.inner_text(), 15)
            page.wait_for_timeout(1000)
            saved.append(save_element(page, output, out, "debug-relayed-prompt", "light"))
            page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
            wait_for("the dark theme", lambda: page.evaluate("document.body.dataset.jpThemeLight") == "false", 30)
            page.wait_for_timeout(1000)
            saved.append(save_element(page, output, out, "debug-relayed-prompt", "dark"))
            answer = cell.locator(".jp-Stdin-input")
            answer.fill("c")
            answer.press("Enter")
            wait_for("the cell's end", lambda: "done 1" in output.inner_text(), 60)
        except BaseException:
            failed = Path(tempfile.gettempdir()) / "nbdist-debug-screenshots-failed.png"
            with contextlib.suppress(Exception):
                page.screenshot(path=str(failed))
                print(f"the page when it failed: {failed}", file=sys.stderr)
            raise
        finally:
            browser.close()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--only", choices=("hang", "prompt"), help="make only that picture (both by default)")
    args = parser.parse_args()
    if args.only in (None, "hang"):
        with tempfile.TemporaryDirectory() as tmp:
            execute_hang(Path(tmp))
            for theme in ("light", "dark"):
                screenshot_hang(Path(tmp), args.out, args.chromium, theme)
    if args.only in (None, "prompt"):
        with tempfile.TemporaryDirectory() as tmp:
            screenshot_prompt(Path(tmp), args.out, args.chromium)


if __name__ == "__main__":
    main()
