"""Rank sets as people write them (``0-3,5``): folding, parsing back, in sentences, and column headings. Pure."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from nbdist import ranksets
from nbdist.ranksets import CUT_AT, fold, header, name, parse, ranks_text, who_said


@pytest.mark.parametrize(("ranks", "text"), [
    ([0, 1, 2, 3, 5], "0-3,5"),
    ([6], "6"),
    ([4, 5], "4,5"),
    ([0, 2, 4, 6], "0,2,4,6"),
    ([3, 1, 2, 2, 9, 10, 11, 12], "1-3,9-12"),
    ([], ""),
])
def test_fold_writes_runs_of_three_or_more_as_ranges(ranks, text):
    assert fold(ranks) == text


def test_a_folded_set_parses_back_to_the_same_ranks():
    rng = random.Random(7)
    for _ in range(300):
        ranks = sorted(rng.sample(range(64), rng.randint(1, 64)))
        assert parse(fold(ranks)) == ranks
        assert fold(parse(fold(ranks))) == fold(ranks)


@pytest.mark.parametrize(("ranks", "text"), [
    ([3], "rank 3"),
    ([4, 5], "ranks 4,5"),
    ([0, 1, 2], "ranks 0-2"),
    ([0, 1, 2, 3, 5], "ranks 0-3,5"),
    ([5, 2, 1, 0, 2, 1], "ranks 0-2,5"),
    ([7, 7], "rank 7"),
    ([], "no rank"),
])
def test_ranks_text_names_one_rank_or_the_folded_set(ranks, text):
    assert ranks_text(ranks) == text
    assert ranks_text(iter(ranks)) == text


def test_who_said_names_each_group_by_its_folded_set_in_the_order_given():
    assert who_said({"4": [0, 1, 2], "5": [3]}) == "ranks 0-2: 4; rank 3: 5"
    assert who_said({"shape [3]": [3, 1], "shape [2]": [0, 2, 2, 4, 5, 6]}) == (
        "ranks 1,3: shape [3]; ranks 0,2,4-6: shape [2]")
    assert who_said({"x": [9]}) == "rank 9: x"
    assert who_said({}) == ""


# "rank(s) 0, 1, 2" and "rank{'s' if len(ranks) > 1 else ''}": ranks named by hand instead of by ranks_text.
BY_HAND = re.compile(r"rank\(s\) \{|rank\{'s' if len\(")


def test_no_message_names_ranks_by_hand_outside_ranksets():
    package = Path(ranksets.__file__).resolve().parent
    found = [f"{path.relative_to(package)}:{n}" for path in sorted(package.rglob("*.py")) if path.name != "ranksets.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if BY_HAND.search(line)]
    assert found == []
    assert BY_HAND.search("f\"rank(s) {', '.join(map(str, who))}: {text}\"")


@pytest.mark.parametrize(("text", "ranks"), [
    ("0-3,5", [0, 1, 2, 3, 5]), (" 7 ", [7]), ("2,0,1", [0, 1, 2]), ("0-1,1-2", [0, 1, 2]),
])
def test_parse_reads_lists_and_ranges_in_any_order(text, ranks):
    assert parse(text) == ranks


@pytest.mark.parametrize(("text", "says"), [
    ("0-", "not a rank set"), ("a", "not a rank set"), ("3-1", "not a range"), ("", "not a rank set"),
    ("-1", "not a rank set"),
])
def test_a_malformed_set_is_refused_saying_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        parse(text)


def test_a_set_beyond_the_world_is_refused_naming_the_world_s_ranks():
    with pytest.raises(ValueError, match=r"names rank 8, but this world's ranks are 0-7"):
        parse("0-3,8", world_size=8)
    assert parse("all", world_size=3) == [0, 1, 2]


@pytest.mark.parametrize(("ranks", "world", "text"), [
    ([0, 1, 2, 3, 5], 8, "ranks 0-3,5 (5)"),
    ([6], 8, "rank 6"),
    (list(range(8)), 8, "all 8 ranks"),
    ([0, 1, 2, 3, 4, 5, 7], 8, "all but rank 6"),
    ([0, 1, 2, 4, 5, 7], 8, "all but ranks 3,6"),
    ([0, 1], 4, "ranks 0,1 (2)"),
])
def test_names_fold_the_set_and_count_it(ranks, world, text):
    assert name(ranks, world) == text


def test_a_long_set_is_cut_in_the_heading_and_whole_in_the_full_name():
    evens = list(range(0, 64, 2))
    short, whole = header(evens, 64)
    assert short.endswith("… (32)") and len(short) < CUT_AT + len("ranks … (32)") + 1
    assert whole == f"ranks {fold(evens)} (32)" and parse(whole.split()[1]) == evens
    assert header([1, 2, 3], 8) == ("ranks 1-3 (3)", "ranks 1-3 (3)")
