"""%dist_compare's decisions (nbdist.diverge.compare): from what every rank holds under a name (entries with
digests), the groups of ranks, the first differing entry, what is asked for element by element, and what is said;
every rank decides alike. Tables, no process group."""

from __future__ import annotations

import pytest

from nbdist.diverge.compare import (
    Ask,
    Held,
    Probe,
    Tolerance,
    asks,
    by_ranks,
    command,
    decide,
    groups,
    index_text,
)
from nbdist.diverge.hashing import ABSENT, MODULE, NUMBER, OPAQUE, RNG, STATE, TENSOR, VALUE, Entry, entry_name
from nbdist.errors import ConfigError


def bias(digest: str, shape: tuple[int, ...] = (2,)) -> Entry:
    return Entry("fc2.bias", TENSOR, digest, shape, "torch.float32")


WEIGHT = Entry("fc2.weight", TENSOR, "w", (2, 3), "torch.float32")
NONE = Held(ABSENT)


def model(*entries: Entry) -> Held:
    return Held(MODULE, "Net", entries)


def tensor(digest: str, shape: tuple[int, ...] = (2, 3), dtype: str = "torch.float32") -> Held:
    return Held(TENSOR, "Tensor", (Entry("", TENSOR, digest, shape, dtype),))


def number(shown: str) -> Held:
    return Held(VALUE, "float", (Entry("", NUMBER, f"d{shown}", shown=shown),))


@pytest.mark.parametrize(("keys", "grouped"), [
    ({0: "a", 1: "a", 2: "b", 3: "a"}, [[0, 1, 3], [2]]),  # largest first
    ({0: "a", 1: "b", 2: "b", 3: "a"}, [[0, 3], [1, 2]]),  # a tie: the lowest rank's first
    ({0: "x"}, [[0]]),
])
def test_ranks_are_grouped_by_what_they_hold_largest_group_first(keys, grouped):
    assert groups(keys) == grouped


def test_values_are_said_by_rank_set():
    assert by_ranks({0: "1", 1: "1", 2: "1", 3: "2"}) == "1 on ranks 0-2 · 2 on rank 3"


@pytest.mark.parametrize(("path", "name"), [
    ([("attr", "fc2.bias")], "fc2.bias"),
    ([("attr", "state"), ("key", "fc1.weight"), ("attr", "exp_avg")], "state['fc1.weight'].exp_avg"),
    ([("attr", "param_groups"), ("index", 0), ("attr", "lr")], "param_groups[0].lr"),
    ([("key", "w"), ("index", 1)], "['w'][1]"),
    ([("key", 3)], "[3]"),
    ([], ""),
])
def test_entries_are_named_as_a_person_writes_them(path, name):
    assert entry_name(path) == name


@pytest.mark.parametrize(("flat", "shape", "text"), [(5, (2, 3), "[1, 2]"), (0, (4,), "[0]"),
                                                     (7, (2, 2, 2), "[1, 1, 1]"), (0, (), "[]")])
def test_a_flat_index_is_shown_as_the_tensors_own(flat, shape, text):
    assert index_text(flat, shape) == text


@pytest.mark.parametrize(("held", "headline"), [
    ([model(WEIGHT, bias("b"))] * 4, "m: alike on ranks 0-3 (2 entries)"),
    ([model(WEIGHT, bias("b")), model(WEIGHT, bias("b")), NONE],
     "m: missing on rank 2; alike on ranks 0,1 (2 entries)"),
    ([tensor("t"), tensor("t"), Held(VALUE, "list"), tensor("t")],
     "m: a value on rank 2; alike on ranks 0,1,3 (1 entry)"),
    ([NONE, NONE], "m: no rank holds it"),
    ([Held(OPAQUE, "Lock")] * 2, "m: a Lock on ranks 0,1: not compared (tensors, modules, optimizers, numbers, "
                                 "text, and dicts and lists of them are)"),
])
def test_what_is_alike_missing_or_of_another_kind_is_said_in_one_line(held, headline):
    verdict = decide("m", held)
    assert verdict.lines == (headline,)


def test_a_module_with_one_differing_bias_names_it_and_its_elements_by_rank_set():
    held = [model(WEIGHT, bias("b")), model(WEIGHT, bias("b")), model(WEIGHT, bias("b")), model(WEIGHT, bias("B"))]
    assert asks("model", held, None) == [Ask("model", "fc2.bias", 0, (2,), "torch.float32", (3,))]
    probes = {"fc2.bias": {3: Probe(1, 2, ((1, "0.75", "0.25"),), 0.5, 2.0)}}
    verdict = decide("model", held, probes)
    assert verdict.lines == (
        "model: differs: 2 groups, ranks 0-2 · rank 3",
        "  1 of 2 entries differs; the first: fc2.bias",
        "  fc2.bias: tensor 2 float32; elements that differ: 1 of 2 on rank 3",
        "    [1]: 0.25 on ranks 0-2 · 0.75 on rank 3",
        "    largest difference from ranks 0-2: 0.5 (rank 3); relative 2 (rank 3)",
    )
    assert verdict.differing == ("fc2.bias",) and not verdict.alike


def test_elements_are_shown_by_rank_set_a_few_at_most_from_every_rank_that_differs():
    held = [tensor("a", (8,)), tensor("b", (8,)), tensor("c", (8,))]
    probes = {"": {1: Probe(2, 8, ((0, "9", "0"), (6, "9", "6")), 9.0, 1.5),
                   2: Probe(8, 8, tuple((i, "-1", str(i)) for i in range(4)), 7.0, 1.0)}}
    lines = decide("t", held, probes).lines
    assert lines[1] == "  t: tensor 8 float32; elements that differ: 2 of 8 on rank 1 · 8 of 8 on rank 2"
    assert lines[2:6] == ("    [0]: 0 on rank 0 · 9 on rank 1 · -1 on rank 2", "    [1]: 1 on ranks 0,1 · -1 on rank 2",
                          "    [2]: 2 on ranks 0,1 · -1 on rank 2", "    [3]: 3 on ranks 0,1 · -1 on rank 2")
    assert lines[6] == "    largest difference from rank 0: 9 (rank 1); relative 1.5 (rank 1)"


@pytest.mark.parametrize(("held", "said"), [
    ([tensor("a"), tensor("b", (3, 2))], ["  t: tensor 2x3 float32 on rank 0 · tensor 3x2 float32 on rank 1"]),
    ([tensor("a"), tensor("b", dtype="torch.float64")],
     ["  t: tensor 2x3 float32 on rank 0 · tensor 2x3 float64 on rank 1"]),
    ([number("0.1"), number("0.1"), number("0.2")], ["  t: 0.1 on ranks 0,1 · 0.2 on rank 2"]),
])
def test_the_first_differing_entry_says_its_shapes_or_values_by_rank_set(held, said):
    assert asks("t", held, None) == []  # nothing to send element by element
    assert list(decide("t", held).lines[1:]) == said


def test_an_entry_missing_on_some_ranks_counts_as_differing():
    held = [model(WEIGHT, bias("b")), model(WEIGHT)]
    assert decide("m", held).lines == ("m: differs: 2 groups, rank 0 · rank 1",
                                       "  1 of 2 entries differs; the first: fc2.bias", "  fc2.bias: missing on rank 1")


def test_the_first_differing_entry_is_first_in_the_models_order_and_every_one_is_counted():
    other_w = Entry("fc2.weight", TENSOR, "W", (2, 3), "torch.float32")
    held = [model(WEIGHT, bias("b")), model(other_w, bias("B"))]
    verdict = decide("m", held)
    assert verdict.differing == ("fc2.weight", "fc2.bias")
    assert verdict.lines[1] == "  2 of 2 entries differ; the first: fc2.weight"


@pytest.mark.parametrize(("probe", "headline"), [
    (Probe(0, 6, (), 1e-7, 1e-7), "t: alike within atol=1e-05, rtol=0 on ranks 0,1 (1 entry, 1 not bit for bit)"),
    (Probe(1, 6, ((2, "1.5", "1"),), 0.5, 0.5), "t: differs: 2 groups, rank 0 · rank 1"),
])
def test_with_a_tolerance_entries_within_it_count_as_alike(probe, headline):
    held = [tensor("a"), tensor("b")]
    tol = Tolerance(1e-5, 0.0)
    assert asks("t", held, tol) == [Ask("t", "", 0, (2, 3), "torch.float32", (1,))]
    lines = decide("t", held, {"": {1: probe}}, tol).lines
    assert lines[0] == headline
    if probe.differ:
        assert lines[1] == "  t: tensor 2x3 float32; elements that differ beyond atol=1e-05, rtol=0: 1 of 6 on rank 1"


def test_with_a_tolerance_every_entry_whose_digests_differ_is_asked_and_numbers_need_no_asking():
    held = [model(WEIGHT, bias("b"), Entry("lr", NUMBER, "x", shown="0.1")),
            model(Entry("fc2.weight", TENSOR, "W", (2, 3), "torch.float32"), bias("B"),
                  Entry("lr", NUMBER, "y", shown="0.1000001"))]
    tol = Tolerance(1e-3, 0.0)
    assert [a.entry for a in asks("m", held, tol)] == ["fc2.weight", "fc2.bias"]
    assert [a.entry for a in asks("m", held, None)] == ["fc2.weight"]
    close = {"fc2.weight": {1: Probe(0, 6)}, "fc2.bias": {1: Probe(0, 2)}}
    assert decide("m", held, close, tol).lines == (
        "m: alike within atol=0.001, rtol=0 on ranks 0,1 (3 entries, 3 not bit for bit)",)
    far = {"fc2.weight": {1: Probe(0, 6)}, "fc2.bias": {1: Probe(1, 2, ((0, "3", "1"),), 2.0, 2.0)}}
    assert decide("m", held, far, tol).lines[1] == "  1 of 3 entries differs; the first: fc2.bias"


def test_the_generators_are_each_said_where_they_differ():
    def gens(seed: str, torch_state: str) -> Held:
        return Held(RNG, "generators", (Entry("torch.initial_seed", NUMBER, f"s{seed}", shown=seed),
                                        Entry("torch", STATE, torch_state), Entry("random", STATE, "r")))
    held = [gens("0", "a"), gens("1", "b"), gens("0", "a")]
    assert asks("RNG states", held, None) == []
    assert decide("RNG states", held).lines == (
        "RNG states: differs: 2 groups, ranks 0,2 · rank 1",
        "  2 of 3 entries differ; the first: torch.initial_seed",
        "  torch.initial_seed: 0 on ranks 0,2 · 1 on rank 1",
        "  torch: states differ: ranks 0,2 · rank 1",
    )


def test_what_crosses_between_ranks_reads_back_as_it_was_sent():
    h = model(WEIGHT, Entry("lr", NUMBER, "x", shown="0.1"))
    assert Held.from_json(h.as_json()) == h
    p = Probe(2, 6, ((1, "2", "3"),), 1.0, 0.5)
    assert Probe.from_json(p.as_json()) == p


@pytest.mark.parametrize(("names", "rng", "atol", "rtol", "sent"), [
    (["model", "opt"], False, None, None, (["model", "opt"], False, None)),
    (["model.fc1"], True, 1e-5, None, (["model.fc1"], True, (1e-5, 0.0))),
    ([], True, None, 0.1, ([], True, (0.0, 0.1))),
])
def test_the_magics_line_becomes_one_body_every_rank_runs(names, rng, atol, rtol, sent):
    text = command(names, rng, atol, rtol)
    assert text.startswith("__import__('nbdist.diverge.compare'") and text.endswith(
        f".run(get_ipython().user_ns, {sent[0]!r}, {sent[1]!r}, {sent[2]!r})\n")


@pytest.mark.parametrize(("names", "rng", "atol", "words"), [
    (["x[0]"], False, None, "names of the notebook's namespace"),
    ([], False, None, "needs a NAME"),
    (["x"], False, -1.0, "0 or more"),
])
def test_a_line_that_names_nothing_comparable_is_refused(names, rng, atol, words):
    with pytest.raises(ConfigError, match=words):
        command(names, rng, atol, None)
