"""Many ranks at a glance, on real kernels: 8 ranks (--spawn 8) grouped by their output, and one 16-rank world.

One 8-rank world serves the module (its cells run one after another), also for the 8-rank case of
tests/test_hang_report.py; the 16-rank one is formed once, for one test. What the tables say is read from
the HTML and the text form each cell displays.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time

import pytest

from nbdist.drive import kernels
from nbdist.ranksets import parse

from .conftest import REAPER, free_port, ok, run_in_background
from .test_hang_report import DDP, NEXT, skips_backward
from .test_hang_report import text as unstyled

HEADING = re.compile(r'<th style="[^"]*" title="([^"]*)">([^<]*)</th>')


def _spawn(kernel: kernels.Kernel, n: int) -> None:
    r = kernel.execute(f"%dist_init --spawn {n} --master-port {free_port()}", timeout=300)
    assert r.status == "ok", r.error
    assert f"nbdist world · {n} rank(s)" in r.text(), r.text()


@pytest.fixture(scope="module")
def eight():
    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        _spawn(k, 8)
        yield k
    finally:
        k.execute("%unload_ext nbdist", timeout=60)
        REAPER.later([k])


def _groups(r: kernels.Result) -> list[str]:
    """The column headings of the last table the cell showed (its final form), without the wall times."""
    html = (r.updates("text/html") or r.displays())[-1]
    return [short.split(" · ")[0] for _, short in HEADING.findall(html)]


def test_eight_ranks_are_grouped_by_parity_and_a_loss_per_rank_is_one_summarised_column(eight):
    r = eight.execute('%%collective\nprint("even" if RANK % 2 == 0 else "odd")\n'
                      'print(f"loss = {2.3 + RANK / 1000:.4f}")\n', timeout=120)
    assert r.status == "ok", r.error
    assert _groups(r) == ["ranks 0,2,4,6 (4)", "ranks 1,3,5,7 (4)"], r.text()
    text = r.text()
    assert "loss = ⟨2.3000 … 2.3060⟩  4 ranks · median 2.3030" in text, text
    assert "loss = ⟨2.3010 … 2.3070⟩  4 ranks · median 2.3040" in text, text
    r = eight.execute('%%collective\nprint(f"loss = {2.3 + RANK / 1000:.4f}")\n', timeout=120)
    assert _groups(r) == ["all 8 ranks"], r.text()
    assert "loss = ⟨2.3000 … 2.3070⟩  8 ranks · median 2.3035 · spread 0.30% · min rank 0 · max rank 7" in r.text()
    assert "identical" not in (r.updates("text/html") or r.displays())[-1]  # different numbers are never "identical"


def test_one_raising_rank_stands_alone_and_view_ranks_gives_a_column_each(eight):
    r = eight.execute('%%collective\nprint("ready")\nif RANK == 6:\n    raise ValueError("rank six is unwell")\n',
                      timeout=120)
    assert r.status == "error" and "rank six is unwell" in (r.error or {}).get("evalue", "") + r.text(), r.error
    assert _groups(r) == ["all but rank 6", "rank 6"], r.text()
    r = eight.execute("%%collective --view ranks\nprint(RANK * 11)\n", timeout=120)
    assert r.status == "ok", r.error
    html = (r.updates("text/html") or r.displays())[-1]
    assert all(f">rank {k} · " in html for k in range(8)) and "groups of equal output" not in html
    assert eight.execute("%dist_config view=ranks", timeout=30).text().startswith("nbdist: view=ranks")
    r = eight.execute("%%collective\nprint(RANK % 2)\n", timeout=120)
    assert ">rank 7 · " in (r.updates("text/html") or r.displays())[-1]
    assert "view=auto" in eight.execute("%dist_config view=auto", timeout=30).text()


def test_a_cell_on_ranks_0_3_runs_there_only_and_show_and_rank_output_pick_columns(eight):
    r = eight.execute("%%collective --ranks 0-3\nran_here = RANK\nprint('member', RANK)\n", timeout=120)
    assert r.status == "ok", r.error
    groups = _groups(r)
    assert "ranks 4-7 (4)" in groups and len(groups) == 2, r.text()
    assert "skipped: this cell runs on ranks 0-3 only (--ranks)" in r.text()
    r = eight.execute("%%collective\n'ran_here' in dir()\n", timeout=120)
    assert _groups(r) == ["ranks 0-3 (4)", "ranks 4-7 (4)"], r.text()
    r = eight.execute("%%collective --show 2,5\nprint(f'I am {RANK}')\n", timeout=120)
    text = r.text()
    assert "showing ranks 2,5 (2) of 8" in text and "I am 2" in text and "I am 5" in text and "I am 3" not in text
    r = eight.execute("nbdist_col = __import__('nbdist').rank_output(5)\nprint(repr(nbdist_col))", timeout=30)
    assert r.status == "ok", r.error
    assert "── rank 5 · " in r.text() and "I am 5" in r.text() and "I am 2" not in r.text(), r.text()


def test_a_rank_that_skips_a_collective_is_shown_apart_from_those_waiting_in_it(eight):
    # Ranks 0-5 and 7 wait in the all_reduce; rank 6 sleeps elsewhere, then ends its body without it.
    code = ("%%collective\nimport time\nt = torch.ones(1)\nif RANK != 6:\n    dist.all_reduce(t)\n"
            "else:\n    time.sleep(4)\n")
    r = eight.execute(code, timeout=120)
    assert r.status == "error", r.text()
    live = "\n".join(r.updates("text/plain"))
    # Cell lines count the %%collective line as line 1, as a notebook numbers them.
    waits = re.search(r"waits in all_reduce #1 at cell line 5: all but rank 6", live)
    apart = re.search(r"at cell line 7 \(not moving\): rank 6, which has not reached all_reduce #1", live)
    assert waits and apart, live[-3000:]
    assert eight.execute("%%collective\nprint('after')\n", timeout=120).status == "ok"


@pytest.mark.timeout(400)
def test_at_8_ranks_max_time_ends_a_ddp_backward_hang_naming_the_collective_group_and_missing_rank(eight):
    """tests/test_hang_report.py's case at 8 ranks: a DDP model on every rank, rank 7 skips its backward."""
    k = eight
    session = "get_ipython().magics_manager.registry['DistMagics'].session"
    port, token = ast.literal_eval(k.execute("", user_expressions={
        "v": f"({session}.config.master_port, {session}.config.token)"}).expression("v"))
    ok([k.execute(DDP, timeout=120)])
    thread, box = run_in_background(k, skips_backward(7, 90, "--max-time 20"), timeout=300)
    report = ""
    for _ in range(60):  # nbdist where in a terminal, while it hangs
        done = subprocess.run([sys.executable, "-m", "nbdist.cli", "where", "--master-addr", "127.0.0.1",
                               "--master-port", str(port), "--token", token],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        report = done.stdout
        if "rank 7 missing" in report or "r" in box:
            break
        time.sleep(1)
    assert re.search(r"the default group: all_reduce #\d+ .*ranks 0-6 entered, rank 7 missing", report), report
    assert "8 answered" in report, report
    assert "├─ all but rank 7" in report and "cell line 5: loss.backward()" in report, report
    assert "└─ rank 7" in report and "cell line 7: time.sleep(90)" in report, report

    thread.join(300)
    r = box["r"]
    shown = unstyled(r)
    assert r.status == "error" and r.error["ename"] == "MaxTimeError", r.error
    # One cause, two places: ranks 0-6 in the backward, rank 7 asleep; each kernel's cell file and pid taken out.
    # (Under load a rank in the backward may be cut by another's --max-time before its own runs out: then it reads
    # "stopped in `loss.backward()` ... because rank N ..." and stands apart, a third group.)
    groups = _groups(r)
    assert groups[-1] == "rank 7" and len(groups) <= 3 and (len(groups) == 2) == (groups[0] == "all but rank 7"), shown
    assert len(groups) == 3 or re.search(r"MaxTimeError: each of ranks 0-6 \(\S+, pids \d+, \d+", shown), shown
    assert "cell line 5, in <module>" in shown and "cell line 7, in <module>" in shown, shown
    where = shown[shown.find("nbdist: where every rank was"):]
    assert where, shown
    assert re.search(r"the default group: all_reduce #\d+ .*ranks 0-6 entered, rank 7 missing", where), where
    assert "cell line 7: time.sleep(90)" in where, where
    assert "3.0" not in shown
    assert "8.0" in unstyled(ok([k.execute(NEXT, timeout=180)])[0])  # the group was rebuilt: the next cell works


def test_sixteen_ranks_group_in_the_table_the_status_and_the_dashboard():
    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        _spawn(k, 16)
        r = k.execute('%%collective\nprint(["a", "b", "c"][RANK % 3], f"{RANK / 7:.3f}")\n', timeout=180)
        assert r.status == "ok", r.error
        assert _groups(r) == ["ranks 0,3,6,9,12,15 (6)", "ranks 1,4,7,10,13 (5)", "ranks 2,5,8,11,14 (5)"], r.text()
        status = k.execute("%dist_status", timeout=60).text()
        assert "16 ranks in 1 group of alike columns" in status, status
        assert "── all 16 ranks ──" in status and "pid: ⟨" in status, status
        board = k.execute("%dist_dashboard --once", timeout=60).text()
        sets = [line.split()[0] for line in board.splitlines()[2:] if line.strip()]
        assert 1 <= len(sets) <= 3, board  # a line per group of alike ranks, not 16
        assert sorted(r for s in sets for r in parse(s)) == list(range(16)), board
    finally:
        k.execute("%unload_ext nbdist", timeout=60)
        REAPER.later([k])
