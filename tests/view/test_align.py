"""Aligning the ranks' output sequences: equal outputs once, nothing reordered. Pure, no kernel."""

from __future__ import annotations

from nbdist.view.align import MAX_WORK, align


def _render(seqs: list[list[str]]) -> list[str]:
    out = []
    for seg in align(seqs):
        parts = ["".join(s[a:b]) for s, (a, b) in zip(seqs, seg.spans, strict=True)]
        out.append(f"={parts[0]}" if seg.same else "≠" + "|".join(parts))
    return out


def test_equal_sequences_are_one_shared_segment_per_output() -> None:
    assert _render([list("abc"), list("abc")]) == ["=a", "=b", "=c"]


def test_what_differs_between_shared_outputs_is_one_segment_per_gap() -> None:
    assert _render([list("aXbc"), list("abYc")]) == ["=a", "≠X|", "=b", "≠|Y", "=c"]


def test_three_ranks_share_only_what_all_three_produced() -> None:
    assert _render([list("aXbYc"), list("abZc"), list("aQbc")]) == ["=a", "≠X||Q", "=b", "≠Y|Z|", "=c"]


def test_every_output_of_every_rank_appears_once_in_its_own_order() -> None:
    seqs = [list("abcabcxyz"), list("bcaxbyz"), list("zyxabc")]
    covered = [[] for _ in seqs]
    for seg in align(seqs):
        for r, (a, b) in enumerate(seg.spans):
            covered[r] += seqs[r][a:b]
    assert covered == seqs


def test_a_rank_with_no_output_differs_from_one_with_output() -> None:
    assert _render([[], ["a"]]) == ["≠|a"]
    assert _render([[], []]) == []


def test_huge_sequences_fall_back_to_common_head_and_tail_without_stalling() -> None:
    n = int(MAX_WORK**0.5) + 10
    a = ["h"] + [f"a{i}" for i in range(n)] + ["t"]
    b = ["h"] + [f"b{i}" for i in range(n)] + ["t"]
    segments = align([a, b])
    assert [s.same for s in segments] == [True, False, True]
