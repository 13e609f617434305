"""Output that differs only in its numbers: templates, summaries, strips and outliers. Pure."""

from __future__ import annotations

import math

from nbdist.view.numbers import SLOT, fold_alike, summarise, template


def test_template_takes_out_numbers_that_stand_alone_and_keeps_names_and_hashes():
    shape, numbers = template("step 3 loss=2.3011 lr 1e-3 x2 cuda:1 3fa9 -0.5")
    assert numbers == ["3", "2.3011", "1e-3", "1", "-0.5"]
    assert shape == f"step {SLOT} loss={SLOT} lr {SLOT} x2 cuda:{SLOT} 3fa9 {SLOT}"


def test_a_loss_per_rank_reads_as_one_line_with_its_summary():
    values = [2.3094, 2.3100, 2.3150, 2.3011, 2.3050, 2.3120, 2.3187, 2.3090]
    summary = summarise([f"loss = {v:.4f}\n" for v in values], list(range(8)))
    text = summary.as_text()
    assert text.startswith("loss = ⟨2.3011 … 2.3187⟩  8 ranks · median 2.3097 · spread 0.76% · min rank 3 · "
                           "max rank 6")
    assert "outlier" not in text
    strip = text.split()[-1]
    assert len(strip) == 8 and strip[3] == "▁" and strip[6] == "█"  # one mark per rank, in rank order
    html = summary.as_html("")
    assert html.count('title="rank ') == 8 and "rank 6: 2.3187" in html


def test_an_outlier_is_flagged_by_its_robust_z_score():
    values = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 9.0]
    text = summarise([f"grad norm {v}" for v in values], list(range(8))).as_text()
    assert "outlier: rank 7 (z +" in text
    flat = summarise([f"t {v}" for v in [5, 5, 5, 5, 5, 5, 5, 6]], list(range(8))).as_text()
    assert "outlier: rank 7 (the others are equal)" in flat


def test_the_strip_reads_at_64_ranks():
    summary = summarise([f"v {r * 0.5}" for r in range(64)], list(range(64)))
    varying = summary.varying[0]
    assert len(varying.strip_text()) == 64 and varying.strip_html().count("<span title=") == 64
    assert not varying.outliers()


def test_texts_that_differ_in_more_than_numbers_are_not_summarised():
    assert summarise(["loss 1.0", "gain 1.0"], [0, 1]) is None
    assert summarise(["loss 1.0", "loss 1.0"], [0, 1]) is None  # equal: nothing to summarise


def test_different_numbers_are_never_shown_as_one():
    # 2.30000001 and 2.3 print alike at 4 decimals: the range keeps each rank's own text.
    summary = summarise(["x 2.30000001", "x 2.3"], [0, 1])
    assert summary is not None and "⟨2.3 … 2.30000001⟩" in summary.as_text()


def test_multi_line_output_summarises_each_varying_number_under_its_line():
    texts = [f"rank {r} of 4\nstep 1 loss {1 + r / 10:.2f} acc {0.5 + r / 100:.2f}\ndone\n" for r in range(4)]
    lines = summarise(texts, list(range(4))).as_text().split("\n")
    assert lines[0].startswith("rank ⟨0 … 3⟩ of 4  4 ranks")
    assert lines[1] == "step 1 loss ⟨1.00 … 1.30⟩ acc ⟨0.50 … 0.53⟩"
    assert lines[2].startswith("    ⟨1.00 … 1.30⟩  4 ranks · median 1.15")
    assert lines[3].startswith("    ⟨0.50 … 0.53⟩  4 ranks")
    assert lines[4] == "done"


def test_many_varying_numbers_are_counted_past_the_first_few():
    texts = [" ".join(str(r * k) for k in range(1, 12)) for r in range(3)]
    text = summarise(texts, [0, 1, 2]).as_text()
    assert text.endswith("… and 5 more numbers that differ between ranks")


def test_fold_alike_groups_rows_that_differ_in_numbers_and_keeps_the_rest_apart():
    rows = [("joined", "0.3 s ago"), ("joined", "0.5 s ago"), ("left", ""), ("joined", "0.4 s ago")]
    assert fold_alike(rows, [0, 1, 2, 3]) == [([0, 1, 3], ("joined", "⟨0.3 … 0.5⟩ s ago")), ([2], ("left", ""))]
    assert math.isclose(float(fold_alike([("1.5",), ("1.5",)], [4, 5])[0][1][0]), 1.5)
