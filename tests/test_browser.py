"""nbdist where people use it: JupyterLab and Notebook 7 in a real browser (headless Chromium via Playwright).

One JupyterLab server per run of this file, on loopback with a temporary root and no token. Its two
notebooks are copies of examples/two_notebooks (on a free port instead of 29500; rank 0 also shows
``%dist_dashboard`` and both draw a picture; no ``%dist_destroy`` at the end), opened as two tabs side by
side. Each runs through the UI (Run > Run All Cells); the tests read what that showed, from the DOM.
Screenshots go to ``$NBDIST_ARTIFACTS`` or a folder under pytest's tmp dir (the path is printed).

Needs Playwright's Python package and a system Chromium (Debian's ``chromium``; no downloaded browser);
without them the tests are skipped, and under CI they fail. Run only these: ``pytest -m browser``; all
but these: ``pytest -m "not browser"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .conftest import free_port, skip_or_fail_in_ci

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "two_notebooks"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1920, "height": 1080}
DASHBOARD_CELL = "%dist_dashboard"
PICTURE_CELL = "%%collective\nimport nbdist\nnbdist.show(torch.arange(4) + 100 * RANK, 'mine')\n"
LONE_CELL = "%%collective\nprint('rank 0 waits here alone')"
STOP_WITHIN = 2.0  # seconds from the stop button to KeyboardInterrupt on the page
# The theme's text on its background must read: WCAG AA for normal text.
MIN_CONTRAST = 4.5

# Each visible cell's text colour and the background it is drawn on, blended up the ancestors as the
# page composes them (the table's tints are translucent), and the WCAG contrast ratio between the two.
CONTRAST_JS = """
(root) => {
  const rgba = (c) => { const v = (c.match(/[\\d.]+/g) || []).map(Number); return v.length === 3 ? [...v, 1] : v; };
  const over = (top, below) => { const a = top[3]; return [0, 1, 2].map(i => top[i] * a + below[i] * (1 - a)); };
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c.length === 4 && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let colour = [255, 255, 255];
    for (const layer of layers.reverse()) colour = over(layer, colour);
    return colour;
  };
  const luminance = (c) => { const [r, g, b] = c.map(v => { v /= 255; return v <= 0.04045 ? v / 12.92 :
                                                   Math.pow((v + 0.055) / 1.055, 2.4); });
                             return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  return [...root.querySelectorAll('td, th, pre')].filter(e => e.innerText.trim()).map(e => {
    const bg = background(e), fg = over(rgba(getComputedStyle(e).color), bg);
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    return {text: e.innerText.trim().slice(0, 40), ratio: (hi + 0.05) / (lo + 0.05),
            border: getComputedStyle(e).borderTopColor};
  });
}
"""


# --- what the run needs ---------------------------------------------------

def _require() -> str:
    """The system Chromium's path, once Playwright and JupyterLab are known to be there."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        skip_or_fail_in_ci("Playwright's Python package is not installed (pip install playwright)")
    for module, package in (("jupyterlab", "jupyterlab"), ("ipywidgets", "ipywidgets")):
        try:
            __import__(module)
        except ImportError:
            skip_or_fail_in_ci(f"{package} is not installed (pip install -e '.[lab]')")
    chromium = os.environ.get("NBDIST_CHROMIUM") or next(
        (p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
         if p and os.path.exists(p)), None)
    if chromium is None:
        skip_or_fail_in_ci("no Chromium found (apt-get install -y chromium, or set NBDIST_CHROMIUM)")
    return chromium


def _notebook(rank: int, port: int) -> nbformat.NotebookNode:
    """An example notebook for this run: a free port, rank 0's dashboard, a picture, no %dist_destroy, and none
    of the committed outputs (the page must show only what this run's cells print)."""
    nb = nbformat.read(EXAMPLES / f"rank{rank}.ipynb", as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    (init,) = [c for c in nb.cells if c.get("id") == "dist-init"]
    assert "MASTER_PORT = 29500" in init.source
    init.source = init.source.replace("MASTER_PORT = 29500", f"MASTER_PORT = {port} ")
    at = nb.cells.index(init) + 1
    extra = [nbformat.v4.new_code_cell(DASHBOARD_CELL, id="dashboard")] if rank == 0 else []
    nb.cells[at:at] = extra
    (gather,) = [c for c in nb.cells if c.get("id") == "allgather"]
    nb.cells.insert(nb.cells.index(gather) + 1, nbformat.v4.new_code_cell(PICTURE_CELL, id="picture"))
    nb.cells = [c for c in nb.cells if c.get("id") != "destroy"]
    return nb


def _settings(folder: Path) -> Path:
    """JupyterLab's user settings: no news pop-up; every cell kept in the DOM (the tests read it)."""
    for name, value in (("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
                        ("apputils-extension/themes", {"theme": "JupyterLab Light"}),
                        ("notebook-extension/tracker", {"windowingMode": "none"})):
        path = folder / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return folder


def _workspace(names: list[str]) -> dict[str, Any]:
    """A JupyterLab workspace: the notebooks as tabs side by side, the side bars closed."""
    widgets = [f"notebook:{n}" for n in names]
    return {"data": {
        "layout-restorer:data": {
            "main": {"dock": {"type": "split-area", "orientation": "horizontal", "sizes": [1 / len(names)] * len(names),
                              "children": [{"type": "tab-area", "currentIndex": 0, "widgets": [w]} for w in widgets]},
                     "current": widgets[0]},
            "left": {"collapsed": True, "visible": True, "widgets": ["filebrowser"]},
            "right": {"collapsed": True, "visible": True, "widgets": []},
        },
        **{w: {"data": {"path": n, "factory": "Notebook"}} for w, n in zip(widgets, names, strict=True)},
    }, "metadata": {"id": "nbdist"}}


class Lab:
    """A JupyterLab server on loopback: a temporary root, no token; stop() is idempotent."""

    def __init__(self, root: Path, settings: Path, workspaces: Path) -> None:
        self.root = root
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = root.parent / "jupyterlab.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}",
                 "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
                 f"--ServerApp.root_dir={root}", "--ServerApp.disable_check_xsrf=True", "--allow-root",
                 f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={workspaces}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"JupyterLab exited: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.base}/api/status", timeout=2)
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"JupyterLab did not answer within 60 s: {self.log.read_text()[-2000:]}"
                                         ) from None
                time.sleep(0.3)

    def put(self, path: str, body: Any) -> None:
        request = urllib.request.Request(f"{self.base}{path}", data=json.dumps(body).encode(), method="PUT",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status in (200, 204), reply.status

    def theme(self, name: str) -> None:
        self.put("/lab/api/settings/@jupyterlab/apputils-extension:themes", {"raw": json.dumps({"theme": name})})

    def stop(self) -> None:
        """Ask, then kill (its kernels are its children: it shuts them down itself)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# --- driving the page -------------------------------------------------------

def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` when ``timeout`` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen within {timeout:g} s")
        time.sleep(every)


def panel(page: Any, rank: int) -> Any:
    return page.locator(".jp-NotebookPanel").filter(has_text=f"this is rank {rank}")


def cell(notebook: Any, source: str) -> Any:
    """The code cell whose input contains ``source``."""
    return notebook.locator(".jp-CodeCell").filter(has=notebook.page.locator(".jp-InputArea", has_text=source)).first


def output_text(notebook: Any, source: str) -> str:
    outputs = cell(notebook, source).locator(".jp-OutputArea")
    return outputs.inner_text() if outputs.count() else ""


def run_all(page: Any, notebook: Any) -> None:
    """Run > Run All Cells, in ``notebook``: its kernel idle first.

    Once in CI, JupyterLab took the command a second after the kernel connected and ran nothing: every prompt
    still ``[ ]`` 90 s later, the kernel idle, nbdist's code never reached. Unless the first code cell is queued
    or run within 20 s, the command is given once more (with a warning in the test's summary).
    """
    notebook.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(timeout=60_000)
    prompt = notebook.locator(".jp-CodeCell .jp-InputPrompt").first
    for attempt in (1, 2):
        notebook.locator(".jp-Cell").first.click()  # makes it the current notebook
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
        try:
            wait_for("the first code cell queued or run", lambda: any(c in prompt.inner_text() for c in "*0123456789"),
                     20)
            return
        except AssertionError:
            if attempt == 2:
                raise
            warnings.warn("JupyterLab ran nothing on Run All Cells: given again", stacklevel=2)


@dataclass
class Walkthrough:
    """What the page showed while both notebooks ran, and where the screenshots are."""

    artifacts: Path
    lab: Lab
    page: Any
    browser: Any
    joins: list[str] = field(default_factory=list)  # rank 0's join status, each version seen
    dashboard: list[tuple[float, str]] = field(default_factory=list)  # (time, text) while cells ran
    dashboard_html: str = ""
    stop_seconds: float | None = None
    stopped_output: str = ""


def _watch_join_and_dashboard(seen: Walkthrough, nb0: Any, until: Callable[[], bool], timeout: float) -> None:
    """Record rank 0's join status and dashboard text, as they change, until ``until()``."""
    deadline = time.monotonic() + timeout
    dash = nb0.locator(".nbdist-dashboard.widget-vbox")
    while not until():
        assert time.monotonic() < deadline, f"the notebooks did not finish within {timeout:g} s; seen: {seen.joins}"
        join = output_text(nb0, "%%dist_init")
        first = join.split("\n", 1)[0]
        if first.startswith("nbdist:") and (not seen.joins or seen.joins[-1] != first):
            seen.joins.append(first)
        if dash.count():
            text = dash.inner_text()
            if not seen.dashboard or seen.dashboard[-1][1] != text:
                seen.dashboard.append((time.monotonic(), text))
        time.sleep(0.1)


def _walk(seen: Walkthrough) -> None:
    page, artifacts = seen.page, seen.artifacts
    page.goto(f"{seen.lab.base}/lab/workspaces/nbdist", timeout=60_000)
    nb0, nb1 = panel(page, 0), panel(page, 1)
    nb0.wait_for(timeout=60_000)
    nb1.wait_for(timeout=60_000)
    run_all(page, nb0)
    # Rank 0 alone: its join status says it waits for rank 1.
    _watch_join_and_dashboard(seen, nb0, lambda: any("waiting for ranks" in j for j in seen.joins), 90)
    run_all(page, nb1)
    done = "all 2 ranks met"
    _watch_join_and_dashboard(seen, nb0, lambda: done in output_text(nb0, "%dist_barrier")
                              and done in output_text(nb1, "%dist_barrier"), 150)
    _watch_join_and_dashboard(seen, nb0, lambda: len(seen.dashboard) >= 3 and
                              time.monotonic() - seen.dashboard[0][0] > 1.5, 10)
    page.screenshot(path=str(artifacts / "after-run-all.png"))
    # The README's picture: both notebooks at the AllReduce table.
    for nb in (nb0, nb1):
        cell(nb, "AllReduce result").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "two-notebooks.png"))
    # Rank 0 runs a %%collective that rank 1 never runs: it waits alone at the start barrier.
    cell(nb0, "%dist_barrier").locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.insert_text(LONE_CELL)
    page.keyboard.press("Shift+Enter")
    dash = nb0.locator(".nbdist-dashboard.widget-vbox")
    wait_for("rank 0 waiting alone, on its dashboard", lambda: "waiting at %%collective" in dash.inner_text(), 20)
    dash.scroll_into_view_if_needed()
    page.wait_for_timeout(2000)  # a few redraws: the wait's seconds count up
    dash.screenshot(path=str(artifacts / "dashboard.png"))
    seen.dashboard_html = dash.inner_html()
    lone = cell(nb0, "waits here alone")
    lone.scroll_into_view_if_needed()
    pressed = time.monotonic()  # before the click: its own time counts too
    nb0.locator('jp-button[data-command="notebook:interrupt-kernel"]').click()
    wait_for("KeyboardInterrupt after the stop button",
             lambda: "KeyboardInterrupt" in output_text(nb0, "waits here alone"), 10, every=0.02)
    seen.stop_seconds = time.monotonic() - pressed
    seen.stopped_output = output_text(nb0, "waits here alone")
    cell(nb0, "waits here alone").locator(".jp-OutputArea-output").last.evaluate(
        "e => e.scrollIntoView({block: 'end'})")
    page.screenshot(path=str(artifacts / "stopped.png"))
    # Saved, for Notebook 7 and the reload in the dark theme.
    for nb in (nb0, nb1):
        nb.locator('jp-button[data-command="docmanager:save"]').click()
    wait_for("rank 0's notebook saved with its outputs",
             lambda: "KeyboardInterrupt" in (seen.lab.root / "rank0.ipynb").read_text(), 20)


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Walkthrough]:
    """Both example notebooks run through JupyterLab's UI once, side by side; the page stays open."""
    chromium = _require()
    from playwright.sync_api import sync_playwright

    base = tmp_path_factory.mktemp("browser")
    artifacts = Path(os.environ.get("NBDIST_ARTIFACTS") or base / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(f"\nnbdist browser test: screenshots in {artifacts}")
    root = base / "root"
    root.mkdir()
    world_port = free_port()
    for rank in (0, 1):
        nbformat.write(_notebook(rank, world_port), root / f"rank{rank}.ipynb")
    workspaces = base / "workspaces"
    workspaces.mkdir()
    lab = Lab(root, _settings(base / "settings"), workspaces)
    try:
        lab.put("/lab/api/workspaces/nbdist", _workspace(["rank0.ipynb", "rank1.ipynb"]))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport=VIEWPORT)
                seen = Walkthrough(artifacts, lab, page, browser)
                try:
                    _walk(seen)
                except BaseException:
                    page.screenshot(path=str(artifacts / "failed.png"))
                    raise
                yield seen
            finally:
                browser.close()
    finally:
        lab.stop()


# --- JupyterLab: what the walkthrough showed -----------------------------------

def test_the_join_status_shows_rank_0_waiting_then_the_world_formed(walkthrough):
    joins = walkthrough.joins
    waiting = [i for i, j in enumerate(joins) if "waiting for ranks" in j and "1/2 joined" in j]
    formed = [i for i, j in enumerate(joins) if "world formed" in j and "2/2 joined" in j]
    assert waiting and formed and waiting[0] < formed[-1], joins
    assert formed[-1] == len(joins) - 1, "the status ends showing the world formed"


def test_the_side_by_side_table_shows_both_ranks_outputs_and_marks_the_rows_that_differ(walkthrough):
    for rank in (0, 1):
        _check_table(panel(walkthrough.page, rank))


def _check_table(notebook: Any) -> None:
    table = cell(notebook, "AllReduce result").locator(".jp-OutputArea-output .nbdist").first
    text = table.inner_text()
    assert "%%collective #1 · 2 ranks" in text
    assert "rank 0 ·" in text and "rank 1 ·" in text
    assert "[Rank 0] initial value: 0.0" in text and "[Rank 1] initial value: 1.0" in text
    assert "≠ differs between ranks" in text  # the printed lines differ
    assert "identical on all 2 ranks" in text  # the Out row, 1.0 on both
    marked = table.locator("th", has_text="differs between ranks").first
    tint = marked.evaluate("e => getComputedStyle(e).backgroundColor")
    assert tint not in ("rgba(0, 0, 0, 0)", "transparent"), "a differing row is tinted"
    same = table.locator("th", has_text="identical on all").first
    assert same.evaluate("e => getComputedStyle(e).backgroundColor") != tint


def test_the_dashboard_renders_as_a_widget_and_its_numbers_change_while_cells_run(walkthrough):
    texts = [text for _, text in walkthrough.dashboard]
    assert len(texts) >= 3, texts
    assert all("rank" in t and "heartbeat" in t and "stop all ranks" in t for t in texts)
    assert len(set(texts)) >= 3  # it kept changing
    assert any("running %%collective" in t or "inside collective" in t for t in texts), texts
    assert "<button" in walkthrough.dashboard_html and "waiting at %%collective" in walkthrough.dashboard_html


def test_the_stop_button_ends_a_collective_waiting_alone_within_2_s_with_keyboard_interrupt(walkthrough):
    assert walkthrough.stop_seconds is not None and walkthrough.stop_seconds < STOP_WITHIN, walkthrough.stop_seconds
    assert "KeyboardInterrupt" in walkthrough.stopped_output


# --- Notebook 7, and the dark theme --------------------------------------------

def test_notebook_7_shows_the_same_table(walkthrough):
    try:
        import notebook  # noqa: F401
    except ImportError:
        skip_or_fail_in_ci("Notebook 7 is not installed (pip install -e '.[lab]')")
    page = walkthrough.browser.new_page(viewport={"width": 1100, "height": 1000})
    try:
        page.goto(f"{walkthrough.lab.base}/notebooks/rank0.ipynb", timeout=60_000)
        notebook_panel = page.locator(".jp-NotebookPanel").first
        cell(notebook_panel, "AllReduce result").locator(".nbdist").first.wait_for(timeout=60_000)
        assert page.evaluate("document.body.dataset.notebook") == "notebooks", "Notebook 7's notebook page"
        _check_table(notebook_panel)
        _check_borders(page, cell(notebook_panel, "AllReduce result").locator(".nbdist").first)
        table = cell(notebook_panel, "AllReduce result").locator(".jp-OutputArea")
        table.scroll_into_view_if_needed()
        table.screenshot(path=str(walkthrough.artifacts / "notebook7-table.png"))
    finally:
        page.close()


@pytest.mark.parametrize("theme", ["JupyterLab Dark", "JupyterLab Light"])
def test_the_table_and_pictures_read_in_the_theme_and_take_its_border_colour(walkthrough, theme):
    lab, page = walkthrough.lab, walkthrough.page
    lab.theme(theme)
    page.reload()
    dark = theme == "JupyterLab Dark"
    wait_for(f"the {theme} theme", lambda: page.evaluate("document.body.dataset.jpThemeLight") == str(not dark).lower(),
             60)
    nb0 = panel(page, 0)
    tables = [cell(nb0, marker).locator(".jp-OutputArea-output .nbdist").first
              for marker in ("AllReduce result", "nbdist.show")]
    for table in tables:
        table.wait_for(timeout=60_000)
    dash = nb0.locator(".nbdist-dashboard.widget-vbox")
    dash.wait_for(timeout=60_000)
    for table in [*tables, dash]:
        cells = table.evaluate(CONTRAST_JS)
        assert cells, "no text found in the table"
        poor = [c for c in cells if c["ratio"] < MIN_CONTRAST]
        assert not poor, f"text that does not read in {theme}: {poor}"
    _check_borders(page, tables[0])
    name = "dark" if dark else "light"
    for rank in (0, 1):
        cell(panel(page, rank), "AllReduce result").evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    page.screenshot(path=str(walkthrough.artifacts / f"two-notebooks-{name}.png"))
    tables[1].screenshot(path=str(walkthrough.artifacts / f"picture-{name}.png"))
    dash.scroll_into_view_if_needed()
    dash.screenshot(path=str(walkthrough.artifacts / f"dashboard-{name}.png"))


def _check_borders(page: Any, table: Any) -> None:
    """The table's borders are drawn in the theme's own --jp-border-color1."""
    border = page.evaluate("getComputedStyle(document.body).getPropertyValue('--jp-border-color1').trim()")
    expected = page.evaluate(f"(() => {{ const e = document.createElement('div'); e.style.color = '{border}'; "
                             "document.body.append(e); const c = getComputedStyle(e).color; e.remove(); return c; })()")
    frame = table.locator("th").first.evaluate("e => getComputedStyle(e).borderTopColor")
    assert frame == expected, f"the table's borders are the theme's --jp-border-color1 ({border}), not {frame}"


def test_an_untrusted_copy_keeps_its_borders_and_tints_through_jupyterlabs_sanitiser(walkthrough):
    """A notebook opened untrusted (nbdist run's output, say) has its HTML sanitised by JupyterLab itself.

    JupyterLab 4.6's sanitiser drops each declaration that uses var(); the plain one before it stays.
    """
    nb = nbformat.read(walkthrough.lab.root / "rank0.ipynb", as_version=4)
    nb.cells[0].source += " "  # any change breaks the signature: the outputs are untrusted
    nbformat.write(nb, walkthrough.lab.root / "untrusted.ipynb")
    page = walkthrough.browser.new_page(viewport={"width": 1100, "height": 1000})
    try:
        page.goto(f"{walkthrough.lab.base}/lab/tree/untrusted.ipynb", timeout=60_000)
        notebook = page.locator(".jp-NotebookPanel").filter(has_text="this is rank 0")
        table = cell(notebook, "AllReduce result").locator(".jp-OutputArea-output .nbdist").first
        table.wait_for(timeout=60_000)
        _check_table(notebook)
        frame = table.locator("th").first.evaluate("e => getComputedStyle(e).borderTopStyle")
        assert frame == "solid", "the borders survive the sanitiser"
        table.screenshot(path=str(walkthrough.artifacts / "untrusted-table.png"))
    finally:
        page.close()
