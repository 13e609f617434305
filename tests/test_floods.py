"""A print in a loop on every rank: the table shows each rank's first and latest lines and counts the rest; every
line stays reachable with ``nbdist.rank_output(k, full=True)`` until the rank leaves the world.

Real kernels: a driving notebook and its spawned workers, on this machine.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import ok, spawned_world

LINES = 20_000
FLOOD = f"%%collective\nfor i in range({LINES}):\n    print(f'rank {{RANK}} line {{i}}')\n"
KEPT = "get_ipython().magics_manager.registry['DistMagics'].last_outcome.captures[{rank}].kept"


@pytest.fixture(scope="module")
def driver() -> Iterator[kernels.Kernel]:
    with spawned_world(2) as k:
        ok([k.execute("import nbdist", timeout=60)])
        yield k


def _kept(k: kernels.Kernel, rank: int) -> dict:
    r = ok([k.execute(f"kept = {KEPT.format(rank=rank)}", user_expressions={"kept": "kept"})])[0]
    return eval(r.expression("kept"))  # noqa: S307 (the repr of a dict of str and int, from our own kernel)


@pytest.mark.timeout(300)
def test_a_flood_on_every_rank_shows_each_ranks_first_and_latest_lines_and_counts_the_rest(driver):
    r = ok([driver.execute(FLOOD, timeout=240)])[0]
    text = r.text()
    for rank in (0, 1):
        assert f"rank {rank} line 0\n" in text and f"rank {rank} line 249\n" in text
        assert f"rank {rank} line {LINES - 1}\n" in text and f"rank {rank} line {LINES - 250}\n" in text
        assert f"rank {rank} line 250\n" not in text and f"rank {rank} line {LINES - 251}\n" not in text
        assert re.search(rf"19,500 lines \(\d+ kB\) not shown: output truncated; the whole output: "
                         rf"nbdist.rank_output\({rank}, full=True\)", text), text[:3000]
    # Every line of another rank, read from the file it kept on its disk.
    r = ok([driver.execute("w = nbdist.rank_output(1, full=True)\nlines = w.splitlines()\n"
                           "print(len(lines), lines[0], '|', lines[-1])\nw", timeout=60)])[0]
    assert f"{LINES} rank 1 line 0 | rank 1 line {LINES - 1}" in r.text()
    assert f"rank 1's whole output: {LINES:,} lines" in r.text()  # shown short, not 20,000 lines again
    r = ok([driver.execute("lines = nbdist.rank_output(1, full=True).splitlines()\n"
                           f"lines == [f'rank 1 line {{i}}' for i in range({LINES})]")])[0]
    assert "True" in r.text()
    kept = _kept(driver, 1)
    assert kept["lines"] == LINES and os.path.exists(kept["path"])


@pytest.mark.timeout(300)
def test_an_ordinary_cell_leaves_nothing_out_and_keeps_no_file(driver):
    r = ok([driver.execute("%%collective\nfor i in range(30):\n    print('line', i)\n", timeout=120)])[0]
    assert "not shown" not in r.text() and "line 29" in r.text()
    assert _kept(driver, 1) is None
    r = ok([driver.execute("print(len(nbdist.rank_output(1, full=True).splitlines()))")])[0]
    assert r.text().strip() == "30"


@pytest.mark.timeout(400)
def test_dist_destroy_removes_every_ranks_kept_output():
    with spawned_world(2) as k:
        ok([k.execute(FLOOD, timeout=240)])
        paths = [_kept(k, rank)["path"] for rank in (0, 1)]
        assert all(os.path.exists(p) for p in paths)
        ok([k.execute("%dist_destroy", timeout=120)])
        deadline = time.monotonic() + 60  # the worker leaves as it sees its driver leave
        while any(os.path.exists(p) for p in paths):
            assert time.monotonic() < deadline, f"still there: {[p for p in paths if os.path.exists(p)]}"
            time.sleep(0.2)


ASK = """\
from nbdist.cell import wholeask
from nbdist.world import signing
magics = get_ipython().magics_manager.registry['DistMagics']
world, key = magics.session.world, signing.key_from(magics.session.secret())
def fetch(path):
    try:
        return wholeask.ask(world.client, world.round, 1, path, key, where='rank 1')
    except LookupError as e:
        return f'refused: {e}'
"""


@pytest.mark.timeout(300)
def test_a_notebook_on_another_host_gets_a_ranks_whole_output_through_the_store_and_nothing_else(driver):
    """What rank_output(k, full=True) does when rank k's disk is not this notebook's: asked here of a worker on this
    machine, as it would be of one on another host."""
    ok([driver.execute(FLOOD, timeout=240)])
    kept = _kept(driver, 1)
    ok([driver.execute(ASK)])
    r = ok([driver.execute(f"text = fetch({kept['path']!r})\n"
                           f"print(text == open({kept['path']!r}).read(), len(text.splitlines()))", timeout=90)])[0]
    assert r.text().strip() == f"True {LINES}"
    r = ok([driver.execute("print(fetch('/etc/passwd'))", timeout=90)])[0]
    assert "refused: rank 1: /etc/passwd is not one of its kept outputs" in r.text()
