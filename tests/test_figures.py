"""The benchmarks page shows only figures the benchmark scripts wrote, each saying what it was measured on.

``docs/development/benchmarks.md`` includes snippets from ``docs/figures/``; each is rendered from its
JSON by ``benchmarks/_common.py``'s ``render`` (so a hand edit of a snippet fails here), or, until its
benchmark has run, says which command records it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development" / "benchmarks.md"
FIGURES = ROOT / "docs" / "figures"
INCLUDE = re.compile(r"^```\{include\} \.\./figures/([\w.-]+)\.md\n```$", re.MULTILINE)
PLACEHOLDER = re.compile(r"\*Not yet recorded: run `(python benchmarks/([a-z_]+)\.py[^`]*)`; .*\*\n")


def _common():
    spec = importlib.util.spec_from_file_location("benchmarks_common", ROOT / "benchmarks" / "_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


common = _common()
NAMES = INCLUDE.findall(PAGE.read_text())


def test_the_benchmarks_page_includes_a_snippet_for_every_benchmark_script_and_each_exists():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("[a-z]*.py")}
    assert scripts <= {name.split("-")[0] for name in NAMES}, "a benchmark script without figures on the page"
    missing = [name for name in NAMES if not (FIGURES / f"{name}.md").is_file()]
    assert not missing, f"the page includes snippets that do not exist: {missing}"


def test_every_recorded_figures_file_is_on_the_page():
    recorded = {p.stem for p in FIGURES.glob("*.json")}
    assert recorded <= set(NAMES), f"figures the page does not show: {sorted(recorded - set(NAMES))}"


@pytest.mark.parametrize("name", NAMES)
def test_each_snippet_is_its_json_rendered_again_or_names_the_command_that_records_it(name: str):
    snippet = (FIGURES / f"{name}.md").read_text()
    source = FIGURES / f"{name}.json"
    if source.is_file():
        data = json.loads(source.read_text())
        assert_says_when_on_what_and_at_which_commit(name, data)
        assert snippet == common.render(data), f"{name}.md differs from its JSON"
        return
    placeholder = PLACEHOLDER.fullmatch(snippet)
    assert placeholder, f"{name}.md has no JSON and is not the 'not yet recorded' note: {snippet!r}"
    command, script = placeholder.groups()
    assert snippet == common.not_recorded(command)
    assert script == name.split("-")[0], f"{name}.md names another script's command: {command}"


def assert_says_when_on_what_and_at_which_commit(name: str, data: dict) -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", data["date"]), data["date"]
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", data["commit"]), data["commit"]
    machine = data["machine"]
    assert machine["cpu"] and machine["os"] and machine["cores"] >= 1, machine
    assert len(machine["load_average_at_start"]) == 3, machine
    assert data["python"] and data["torch"] and data["nbdist"], data
    assert data["command"].startswith(f"python benchmarks/{name.split('-')[0]}.py"), data["command"]
    assert data["rows"], f"{name}.json holds no figures"
    for row in data["rows"]:
        assert row["runs"] >= 1 and isinstance(row["median"], (int, float)), row
        assert (row["low"] is None) == (row["spread"] is None), row
        assert "target" not in row or isinstance(row["met"], bool), row
