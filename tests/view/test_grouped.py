"""The cell table drawn by groups of ranks (many ranks): grouping, headings, numbers, diffs, states. Pure."""

from __future__ import annotations

import re

from nbdist.view.celltable import cell_table
from nbdist.view.display import Cell, SideBySide
from nbdist.world.capture_record import Capture


def _ranks(n: int, hosts: int = 1) -> list[dict]:
    return [{"host": f"host-{'ab'[r * hosts // n]}"} for r in range(n)]


def _cap(text: str, error: dict | None = None, wall: float = 0.01) -> Capture:
    return Capture.from_dict({"outputs": [{"kind": "stdout", "text": text}], "result": None, "error": error,
                              "wall": wall})


def _error(ename: str = "ValueError", evalue: str = "bad", where: str = "cell line 3", path: str = "/tmp/1.py") -> dict:
    tb = f'File "{path}", line 3\n{ename}: {evalue}'
    return {"ename": ename, "evalue": evalue, "traceback": tb, "short": tb, "where": where}


def _headings(html: str) -> list[str]:
    return re.findall(r'<th style="[^"]*" title="[^"]*">([^<]*)</th>', html)


def test_more_than_four_ranks_are_grouped_by_parity_largest_group_first():
    table = cell_table("t", _ranks(8), [_cap("even\n" if r % 2 == 0 else "odd\n") for r in range(8)])
    assert table.by_groups
    heads = _headings(table._repr_html_())
    assert [h.split(" · ")[0] for h in heads] == ["ranks 0,2,4,6 (4)", "ranks 1,3,5,7 (4)"]
    text = repr(table)
    assert text.index("── ranks 0,2,4,6 (4)") < text.index("even") < text.index("── ranks 1,3,5,7 (4)")
    assert text.index("odd") > text.index("── ranks 1,3,5,7 (4)")


def test_one_raising_rank_is_its_own_group_and_the_rest_are_all_but_it():
    caps = [_cap("ok\n", _error() if r == 6 else None) for r in range(8)]
    html = cell_table("t", _ranks(8), caps)._repr_html_()
    heads = [h.split(" · ")[0] for h in _headings(html)]
    assert heads == ["all but rank 6", "rank 6"]
    assert "ValueError: bad" in html


def test_the_same_error_with_different_paths_is_one_group_and_another_message_is_another():
    caps = [_cap("x\n", _error(path=f"/tmp/ipykernel_{r}/1.py")) for r in range(6)]
    caps[5] = _cap("x\n", _error(evalue="worse"))
    heads = [h.split(" · ")[0] for h in _headings(cell_table("t", _ranks(6), caps)._repr_html_())]
    assert heads == ["all but rank 5", "rank 5"]


def test_a_loss_per_rank_is_one_group_with_a_summary_and_is_never_called_identical():
    caps = [_cap(f"loss = {2.3 + r / 1000:.4f}\n") for r in range(8)]
    table = cell_table("t", _ranks(8), caps)
    html, text = table._repr_html_(), repr(table)
    assert [h.split(" · ")[0] for h in _headings(html)] == ["all 8 ranks"]
    assert "numbers differ between ranks" in html and "identical" not in html
    assert "loss = ⟨2.3000 … 2.3070⟩  8 ranks · median 2.3035" in text


def test_hosts_appear_in_the_heading_when_the_world_spans_several():
    caps = [_cap("a\n" if r < 8 else "b\n") for r in range(16)]
    heads = _headings(cell_table("t", _ranks(16, hosts=2), caps)._repr_html_())
    assert heads[0].startswith("ranks 0-7 (8) · host host-a") and heads[1].startswith("ranks 8-15 (8) · host host-b")


def test_past_four_groups_the_reference_is_full_the_others_diffs_and_the_rest_one_click_away():
    caps = [_cap(f"common\nline {'abcdef'[r % 6]}\nend\n", _error() if r == 11 else None) for r in range(12)]
    table = cell_table("t", _ranks(12), caps)
    html, text = table._repr_html_(), repr(table)
    heads = [h.split(" · ")[0] for h in _headings(html)]
    # the reference (ok, largest, lowest rank), then the group that failed, then the largest
    assert heads == ["ranks 0,6 (2)", "rank 11", "ranks 1,7 (2)", "ranks 2,8 (2)"]
    assert html.count("diff against the reference group") >= 2
    assert "… 3 more groups (ranks 3-5,9,10)" in html
    assert "-line a" in text and "+line b" in text  # a diff, changed lines marked
    assert "── ranks 4,10 (2)" in text  # the text form has every group


def test_view_ranks_keeps_a_column_per_rank_and_view_groups_groups_few_ranks():
    caps = [_cap("even\n" if r % 2 == 0 else "odd\n") for r in range(8)]
    per_rank = cell_table("t", _ranks(8), caps, view="ranks")
    assert not per_rank.by_groups and per_rank._repr_html_().count("<th style") == 8 + 2  # 8 ranks, the corner, 1 row
    few = cell_table("t", _ranks(3), [_cap("x\n"), _cap("y\n"), _cap("x\n")], view="groups")
    assert [h.split(" · ")[0] for h in _headings(few._repr_html_())] == ["all but rank 1", "rank 1"]
    assert not cell_table("t", _ranks(3), [_cap("x\n"), _cap("y\n"), _cap("x\n")]).by_groups


def test_wide_columns_switch_to_groups_even_for_few_ranks():
    caps = [_cap(("w" * 150 + "\n") if r % 2 else ("v" * 150 + "\n")) for r in range(4)]
    assert cell_table("t", _ranks(4), caps).by_groups


def test_show_limits_the_columns_to_some_ranks():
    caps = [_cap(f"r{r}\n") for r in range(8)]
    table = cell_table("t", _ranks(8), caps, show=[2, 5])
    text = repr(table)
    assert "showing ranks 2,5 (2) of 8" in table.title
    assert "r2" in text and "r5" in text and "r3" not in text and "rank 0 ·" not in text


def test_live_states_read_as_one_line_by_group():
    caps = [Capture(outputs=[], result=None, error=None, wall=0.0) for _ in range(8)]  # as the live table draws
    states = ["running 34 s"] * 7 + ["finished in 2.0 s, waiting for the others"]
    text = repr(cell_table("t", _ranks(8), caps, states))
    assert "state: running 34 s: all but rank 7 · waiting for the others: rank 7" in text


def test_each_rank_is_one_click_away_up_to_sixteen_ranks():
    caps = [_cap(f"value {r}\n") for r in range(8)]
    html = cell_table("t", _ranks(8), caps)._repr_html_()
    assert html.count("<summary><small>show rank ") == 8
    assert "nbdist.rank_output(7)" in html
    big = cell_table("t", _ranks(32), [_cap(f"value {r}\n") for r in range(32)])._repr_html_()
    assert "show rank " not in big and "nbdist.rank_output(31)" in big


def test_a_status_table_of_many_ranks_folds_alike_columns():
    table = SideBySide("status", [f"rank {r}" for r in range(12)], compare=False)
    table.add("state", [Cell("joined") for _ in range(12)])
    table.add("alive", [Cell("not responding" if r == 3 else f"heartbeat {r / 10:.1f} s ago") for r in range(12)])
    text = repr(table)
    assert "── all but rank 3 ──" in text and "heartbeat ⟨0.0 … 1.1⟩ s ago" in text and "── rank 3 ──" in text
    small = SideBySide("status", [f"rank {r}" for r in range(8)], compare=False)
    small.add("alive", [Cell(f"{r} s") for r in range(8)])
    assert "── rank 7 ──" in repr(small)  # up to 8 ranks: a column each


def test_a_hang_says_where_each_group_waits_and_who_has_not_reached_the_collective():
    caps = [Capture(outputs=[], result=None, error=None, wall=0.0) for _ in range(8)]  # as the live table draws
    states = [f"running 34 s, waits in all_reduce #12 at cell line 8 for {30 + r} s" for r in range(8)]
    states[6] = "running 34 s, at cell line 5 (there for 20 s)"
    text = repr(cell_table("t", _ranks(8), caps, states))
    assert ("state: running 34 s, waits in all_reduce #12 at cell line 8: all but rank 6 · running 34 s, at cell "
            "line 5 (not moving): rank 6, which has not reached all_reduce #12") in text
    states[6] = "running 34 s, at cell line 5 (moving)"
    assert "line 5 (moving): rank 6, which has not reached" in repr(cell_table("t", _ranks(8), caps, states))
