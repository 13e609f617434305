"""The docs' reference pages: every magic a kernel registers and every flag it takes is in them, and the committed
pages are what the code gives now (docs/_ext/nbdist_reference.py writes them at each build)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from nbdist.drive import kernels
from nbdist.healmagics import magic_function

from .conftest import REAPER

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_spec = importlib.util.spec_from_file_location("nbdist_reference", DOCS / "_ext" / "nbdist_reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

# What a kernel registers once the extension is loaded: each nbdist magic (by its class), and its parser's flags.
_REGISTERED = """
import json
from nbdist.healmagics import CLASSES
found = {}
for kind, table in get_ipython().magics_manager.magics.items():
    for name, fn in table.items():
        if isinstance(getattr(fn, "__self__", None), CLASSES):
            parser = getattr(fn, "parser", None)
            flags = sorted(o for a in (parser._actions if parser else []) for o in a.option_strings)
            found.setdefault(name, {"kinds": [], "flags": flags})["kinds"].append(kind)
print("REGISTERED", json.dumps(found))
"""


def _sections(page: str) -> dict[str, str]:
    """A page's "## " sections by heading."""
    parts = re.split(r"^## (.+)$", page, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.fixture(scope="module")
def registered() -> dict[str, dict]:
    k = kernels.Kernel()
    try:
        r = k.execute("%load_ext nbdist", timeout=60)
        assert r.status == "ok", r.error
        r = k.execute(_REGISTERED, timeout=60)
        assert r.status == "ok", r.error
        (line,) = [x for x in r.text().splitlines() if x.startswith("REGISTERED ")]
        return json.loads(line.removeprefix("REGISTERED "))
    finally:
        REAPER.later([k])


def test_every_magic_a_kernel_registers_and_each_of_its_flags_is_in_the_magics_reference(registered):
    page = (DOCS / "reference" / "magics.md").read_text(encoding="utf-8")
    sections = _sections(page)
    assert len(registered) >= 15, sorted(registered)  # the extension loaded its magics
    missing = []
    for name, info in registered.items():
        titles = [t for t in sections if re.search(rf"`[^`]*(?<![\w%])%{{1,2}}{name}(?!\w)", t)]
        if not titles:
            missing.append(f"%{name}: no section")
            continue
        (title,) = titles
        for kind in info["kinds"]:
            if ("%%" if kind == "cell" else "%") + name not in re.findall(r"`([^`]+)`", title):
                missing.append(f"{kind} magic %{name}: its section {title!r} does not name it")
        missing += [f"%{name} {flag}: not in its section" for flag in info["flags"]
                    if not re.search(rf"`{re.escape(flag)}`", sections[title])]
    assert not missing, "\n".join(missing)


def test_every_subcommand_and_flag_of_the_nbdist_command_is_in_the_cli_reference():
    from nbdist.cli import build_parser

    sections = _sections((DOCS / "reference" / "cli.md").read_text(encoding="utf-8"))
    (sub,) = [a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    missing = []
    for name, parser in sub.choices.items():
        body = sections.get(f"`nbdist {name}`")
        if body is None:
            missing.append(f"nbdist {name}: no section")
            continue
        missing += [f"nbdist {name} {o}: not in its section" for a in parser._actions for o in a.option_strings
                    if o not in ("-h", "--help") and f"`{o}`" not in body]
    assert len(sub.choices) >= 9 and not missing, "\n".join(missing)


def test_the_committed_reference_pages_are_what_the_code_gives_now():
    """A changed flag or help text changes the page: rebuild the docs (or run nbdist_reference.write) and commit."""
    for page, text in zip(reference.GENERATED, (reference.magics_markdown(), reference.cli_markdown()), strict=True):
        committed = (DOCS / page).read_text(encoding="utf-8")
        assert committed == text, f"docs/{page} is stale: run python -m sphinx -b html docs docs/_build/html, commit it"


def test_a_changed_flag_shows_in_the_generated_page():
    """The page is drawn from the parser: a flag added to a parser appears, with its help and default."""
    import argparse

    parser = argparse.ArgumentParser(prog="%demo")
    parser.add_argument("--fresh-flag", default=7, metavar="N", help="a flag made here (default %(default)s)")
    rows = "\n".join(reference.flag_rows(parser))
    assert "| `--fresh-flag` | `N` | `7` | a flag made here (default 7) |" in rows, rows


def test_every_nbdist_magic_the_coming_from_page_offers_parses_with_its_flags():
    """docs/coming-from.md: the second column of each table is what to type in nbdist; each `%` line parses."""
    page = (DOCS / "coming-from.md").read_text(encoding="utf-8")
    offered = []
    for row in re.findall(r"^\|(.+)\|\s*$", page, flags=re.M):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)]
        if len(cells) == 2 and not set(cells[1]) <= set("-"):
            offered += [m for m in re.findall(r"`(%%?[^`]+)`", cells[1])]
    assert len(offered) >= 12, offered
    problems = []
    for line in offered:
        prefix, name, rest = re.fullmatch(r"(%%?)(\w+)\s*(.*)", line).groups()
        function = magic_function("cell" if prefix == "%%" else "line", name)
        if function is None:
            problems.append(f"{line}: nbdist has no {prefix}{name}")
            continue
        if rest and getattr(function, "parser", None) is not None:
            try:
                parse_argstring(function, rest)
            except UsageError as exc:
                problems.append(f"{line}: {exc}")
        elif rest and name == "dist_config":
            if not re.fullmatch(r"view=(ranks|groups|auto)", rest):
                problems.append(f"{line}: %dist_config takes view=ranks|groups|auto")
        elif rest:
            problems.append(f"{line}: {prefix}{name} takes no arguments ({shlex.split(rest)})")
    assert not problems, "\n".join(problems)


def _python_blocks(text: str, section: str) -> list[str]:
    """The ```python blocks under a README "## " section, as cells."""
    body = _sections(text)[section]
    return [m.strip() + "\n" for m in re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)]


@pytest.mark.timeout(180)
def test_the_readmes_quick_start_a_runs_as_it_stands_and_shows_what_it_says():
    """README, quick start A: `%dist_init --spawn 2`, then the cell; "`rank 0: 1.0` and `rank 1: 1.0`"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cells = _python_blocks(readme, "Quick start A: one notebook drives")
    assert [c.split()[0] for c in cells] == ["%load_ext", "%dist_init", "%%collective"], cells
    claimed = re.findall(r"`(rank \d: [\d.]+)`", _sections(readme)["Quick start A: one notebook drives"])
    assert claimed == ["rank 0: 1.0", "rank 1: 1.0"], claimed
    k = kernels.Kernel()
    try:
        for cell in cells[:-1]:
            r = k.execute(cell, timeout=120)
            assert r.status == "ok", f"{cell!r}: {r.error}"
        r = k.execute(cells[-1], timeout=120)
        assert r.status == "ok", r.error
        shown = r.text()
        assert all(line in shown for line in claimed) and "rank 1 " in shown, shown
    finally:
        k.execute("%unload_ext nbdist", timeout=60)
        REAPER.later([k])
