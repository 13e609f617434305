"""A print in a loop on every rank (issue 49): 4 driven ranks that each print 20,000 lines in one ``%%collective``.

Measures, from the client, as a new user would:

  1. the cell's wall time (one execute request until the driving kernel is idle) against one plain cell of a
     plain kernel that prints the same 20,000 lines, in alternation, after one uncounted run of each; the ratio
     of the medians (target ≤ 3x);
  2. the bytes the front end receives for the whole cell, live updates included: every iopub message of the
     request as jupyter_client hands it over (header, parent header, metadata and content, as JSON; target
     ≤ 2 MB), beside the plain cell's; and for the same lines printed over about 5 s (a pause every 1,000), so
     that the live table is updated while the body runs, its bytes and its number of updates;
  3. unless ``--no-browser``: the same notebook run in JupyterLab under headless Chromium (Playwright, a system
     Chromium at ``--chromium``), then the same lines over ~15 s: the time from a click on a cell until the page
     marks that cell active, clicks alternating between two cells, while that flood runs (its live table updated)
     and after it; and the characters of the flood cell's output in the page.

Run from the repository root::

    python benchmarks/floods.py [--runs 7] [--no-browser] [--chromium /usr/bin/chromium]

Every process started here is stopped by its id in ``finally`` blocks: the kernels, JupyterLab and whatever
is still alive below them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import begin, figure, load_note, record

from nbdist.drive import kernels

LINES = 20_000
BODY = f"for i in range({LINES}):\n    print(f'rank {{RANK}} step {{i}} loss {{i * 0.001:.4f}}')\n"
# The same lines over about 5 s: the live table is updated while the body runs, and its updates count too.
SLOW = (f"import time\nfor i in range({LINES}):\n    print(f'rank {{RANK}} step {{i}} loss {{i * 0.001:.4f}}')\n"
        "    if i % 1000 == 999:\n        time.sleep(0.25)\n")
SLOW_PAGE = SLOW.replace("time.sleep(0.25)", "time.sleep(0.75)")  # about 15 s in the page: clicks while it runs
RATIO_TARGET, BYTES_TARGET = 3.0, 2_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(kernel: kernels.Kernel, code: str, updates: list[int] | None = None) -> tuple[float, int]:
    """Seconds until ``kernel`` is idle after ``code``, and the bytes of every iopub message of the request;
    ``updates`` gets the number of live table updates."""
    sizes: list[int] = []

    def hook(msg: dict[str, Any]) -> None:
        sizes.append(len(json.dumps({k: msg.get(k) for k in ("header", "parent_header", "metadata", "content")},
                                    default=str).encode()))
        if updates is not None and msg["msg_type"] == "update_display_data":
            updates.append(1)

    start = time.perf_counter()
    reply = kernel.client.execute_interactive(code, timeout=600, output_hook=hook)
    seconds = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the cell failed: {reply['content']}")
    return seconds, sum(sizes)


def _descendants(pid: int) -> set[int]:
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


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


Figures = tuple[list[float], list[float], list[int], list[int], list[tuple[float, int, int]]]


def kernel_figures(runs: int, world_size: int, slow_runs: int) -> Figures:
    plain, driver = kernels.Kernel(), kernels.Kernel()
    below: set[int] = set()
    try:
        plain.execute("RANK = 0")
        driver.execute("%load_ext nbdist", timeout=60)
        r = driver.execute(f"%dist_init --spawn {world_size} --master-port {free_port()}", timeout=300)
        if r.status != "ok":
            raise RuntimeError(f"%dist_init failed: {r.error}")
        if driver.manager.provisioner is not None and getattr(driver.manager.provisioner, "pid", None):
            below = _descendants(driver.manager.provisioner.pid)
        p_s, f_s, p_b, f_b = [], [], [], []
        for i in range(runs + 1):
            order = [("plain", plain, BODY), ("flood", driver, "%%collective\n" + BODY)]
            for name, k, code in order if i % 2 else reversed(order):
                seconds, size = timed(k, code)
                if i == 0:
                    continue  # warm-up
                (p_s if name == "plain" else f_s).append(seconds)
                (p_b if name == "plain" else f_b).append(size)
            if i:
                print(f"run {i}: plain {p_s[-1]:.3f} s {p_b[-1] / 1e6:.2f} MB; "
                      f"{world_size} ranks {f_s[-1]:.3f} s {f_b[-1] / 1e6:.2f} MB", flush=True)
        slow = []
        for i in range(slow_runs):
            updates: list[int] = []
            seconds, size = timed(driver, "%%collective\n" + SLOW, updates)
            slow.append((seconds, size, len(updates)))
            print(f"slow run {i + 1}: {seconds:.1f} s {size / 1e6:.2f} MB, {len(updates)} live updates", flush=True)
        return p_s, f_s, p_b, f_b, slow
    finally:
        with contextlib.suppress(Exception):
            driver.execute("%unload_ext nbdist", timeout=60)
        for k in (plain, driver):
            with contextlib.suppress(Exception):
                k.shutdown()
        _kill(below)


def _notebook(world_size: int) -> dict[str, Any]:
    cells = ["%load_ext nbdist", f"%dist_init --spawn {world_size} --master-port {free_port()}",
             "%%collective\n" + BODY, "x = 1", "%%collective\n" + SLOW_PAGE]
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3",
                                                                            "display_name": "Python 3"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": s, "outputs": [],
                       "execution_count": None} for i, s in enumerate(cells)]}


@contextlib.contextmanager
def lab(root: Path) -> Iterator[str]:
    settings = root.parent / "settings"
    for name, value in (("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
                        ("notebook-extension/tracker", {"windowingMode": "none"})):
        path = settings / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--IdentityProvider.token=", f"--ServerApp.root_dir={root}", "--ServerApp.disable_check_xsrf=True",
         "--allow-root", f"--LabApp.user_settings_dir={settings}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("JupyterLab did not start within 60 s") from None
                time.sleep(0.3)
        yield base
    finally:
        below = _descendants(process.pid)
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        time.sleep(2)  # its kernels end their workers as they exit
        _kill({pid for pid in below if Path(f"/proc/{pid}").exists()})


def browser_figures(chromium: str, world_size: int, clicks: int) -> tuple[list[float], list[float], int]:
    """Click latencies (ms) while the slow flood runs and after it, and the characters of the flood cell's output in
    the page."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="nbdist-floods-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        (root / "flood.ipynb").write_text(json.dumps(_notebook(world_size)))
        with lab(root) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{base}/lab/tree/flood.ipynb", timeout=60_000)
                nb = page.locator(".jp-NotebookPanel").first
                nb.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(timeout=120_000)
                cells = nb.locator(".jp-CodeCell")
                cells.first.click()
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
                cells.nth(3).locator(".jp-InputPrompt", has_text="4").wait_for(timeout=600_000)
                chars = len(cells.nth(2).locator(".jp-OutputArea").inner_html())

                def click(i: int) -> float:
                    target = cells.nth(i % 2 + 2)
                    start = time.monotonic()
                    target.locator(".jp-InputPrompt").click()
                    page.wait_for_function("el => el.classList.contains('jp-mod-active')",
                                           arg=target.element_handle(), timeout=30_000)
                    return (time.monotonic() - start) * 1000

                slow_done = cells.nth(4).locator(".jp-InputPrompt", has_text="5")
                during = []  # while the slow flood runs and its live table is updated
                i = 0
                while not slow_done.count():
                    latency = click(i)
                    if not slow_done.count():
                        during.append(latency)
                    i += 1
                after = [click(i) for i in range(clicks + 1)][1:]
                return during, after, chars
            finally:
                browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--slow-runs", type=int, default=3, help="runs of the same lines over about 5 s")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--clicks", type=int, default=9)
    parser.add_argument("--chromium", default=os.environ.get("NBDIST_CHROMIUM", "/usr/bin/chromium"))
    args = parser.parse_args()
    began = begin()
    print(load_note("at start", judge=True), flush=True)
    at_start = load_note("at start", judge=False) + f" (1, 5, 15 min: {', '.join(f'{v:.2f}' for v in began.load)})"
    p_s, f_s, p_b, f_b, slow = kernel_figures(args.runs, args.world_size, args.slow_runs)
    ratio = statistics.median(f_s) / statistics.median(p_s)
    n = args.world_size
    rows = [
        figure("one plain cell printing 20,000 lines", p_s, "s", decimals=3),
        figure(f"{n} driven ranks each printing 20,000 lines", f_s, "s", decimals=3),
        figure(f"{n} ranks / plain (ratio of the medians)", [], "x", median=ratio, runs=len(f_s),
               target=f"≤ {RATIO_TARGET:g}x", met=ratio <= RATIO_TARGET),
        figure("bytes to the front end, plain cell", [b / 1e6 for b in p_b], "MB"),
        figure(f"bytes to the front end, {n} ranks, live updates included", [b / 1e6 for b in f_b], "MB",
               target="≤ 2 MB", met=statistics.median(f_b) <= BYTES_TARGET and max(f_b) <= BYTES_TARGET),
    ]
    if slow:
        rows += [figure(f"the same over ~5 s (a pause every 1,000 lines): {n} ranks", [x[0] for x in slow], "s",
                        spread="min–max", decimals=1),
                 figure("  its bytes to the front end, live updates included", [x[1] / 1e6 for x in slow], "MB",
                        spread="min–max", target="≤ 2 MB", met=max(x[1] for x in slow) <= BYTES_TARGET),
                 figure("  its live table updates", [float(x[2]) for x in slow], "", spread="min–max", decimals=0)]
    notes = [at_start]
    print(f"ratio {ratio:.2f}x; bytes median {statistics.median(f_b) / 1e6:.3f} MB, max {max(f_b) / 1e6:.3f} MB")
    if not args.no_browser:
        during, after, chars = browser_figures(args.chromium, n, args.clicks)
        print(f"JupyterLab: a click answered in {statistics.median(during):.0f} ms while a ~15 s flood ran (median "
              f"of {len(during)}), {statistics.median(after):.0f} ms after it (median of {len(after)}); the flood "
              f"cell's output {chars:,} characters of HTML")
        rows += [figure("JupyterLab: a click answered while a ~15 s flood runs (Chromium)", during, "ms",
                        decimals=0),
                 figure("JupyterLab: a click answered after the floods (Chromium)", after, "ms", decimals=0),
                 figure("the flood cell's output in the page, HTML", [chars / 1e3], "k characters", decimals=0)]
    notes.append(load_note("at end", judge=False))
    record("floods", f"A print in a loop on every rank: {n} driven ranks × 20,000 lines", rows, began, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
