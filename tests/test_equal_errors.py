"""Equal errors group, on real kernels (issue 49): 4 driven ranks that raise the same error show it once, for
"ranks 0-3", with the cell line rather than each kernel's temporary file (in the full traceback too); errors that
really differ stay apart; the error under the table is said once."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from nbdist.drive import kernels
from nbdist.view.celltable import FULL_TRACEBACK

from .conftest import plain_text, spawned_world

HEADING = re.compile(r'<th style="[^"]*"(?: title="[^"]*")?>([^<]*)</th>')


@pytest.fixture(scope="module")
def four() -> Iterator[kernels.Kernel]:
    with spawned_world(4) as k:
        yield k


def _table(r: kernels.Result) -> tuple[str, str]:
    """The final table's HTML and text form."""
    html = (r.updates("text/html") or r.displays())[-1]
    text = (r.updates("text/plain") or r.displays("text/plain"))[-1]
    return html, text


def _under_table(r: kernels.Result) -> str:
    assert r.error is not None
    return "\n".join(r.error["traceback"])


def test_the_same_error_on_every_rank_is_one_group_shown_with_its_cell_line_and_said_once_below(four):
    r = four.execute("%%collective\nx = 1\nraise ValueError('bad value')\n", timeout=120)
    assert r.status == "error" and r.error["ename"] == "CollectiveError", r.error
    html, text = _table(r)
    assert "error<br><small>identical on all 4 ranks</small>" in html, text
    assert "differs" not in text and "ipykernel_" not in text + html, text
    assert text.count("ValueError: bad value") == 1 and "cell line 3, in <module>" in text, text
    below = _under_table(r)
    assert below.count("bad value") == 1 and "Traceback" not in below, below
    assert "raised ValueError: bad value, as did ranks 1-3 (its traceback is in the table above)" in below, below
    assert plain_text(r).count("ValueError: bad value") == 2  # once in the table, once below it


def test_max_time_on_every_rank_is_one_group_naming_the_ranks_as_a_set(four):
    r = four.execute("%%collective --max-time 1\nimport time\ntime.sleep(30)\n", timeout=120)
    assert r.status == "error" and r.error["ename"] == "MaxTimeError", r.error
    html, text = _table(r)
    assert "identical on all 4 ranks" in html and "differs" not in text, text
    pids = r"\d+, \d+, \d+, \d+"
    assert re.search(rf"MaxTimeError: each of ranks 0-3 \(\S+, pids {pids}\) was still running its body", text), text
    assert "cell line 3, in <module>" in text, text
    full = text.split(FULL_TRACEBACK, 1)[1]  # the group's full traceback, nbdist's frames included: one rank's
    assert "cell line 3, in <module>" in full and "nbdist" in full, text
    assert "ipykernel_" not in text + html, text
    assert len(_under_table(r).splitlines()) == 1, _under_table(r)


@pytest.mark.parametrize("view", ["", " --view groups"])
def test_an_error_that_names_each_ranks_own_number_is_four_groups(four, view):
    r = four.execute(f"%%collective{view}\nraise ValueError(f'bad {{RANK}}')\n", timeout=120)
    assert r.status == "error", r.error
    html, text = _table(r)
    heads = [h.split(" · ")[0] for h in HEADING.findall(html) if h]
    assert heads == [f"rank {k}" for k in range(4)], heads
    assert all(f"ValueError: bad {k}" in text for k in range(4)), text
