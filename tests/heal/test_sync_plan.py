"""%dist_sync's decisions (nbdist.heal.sync): from what every rank holds under a name, where it goes from and to,
or why it is not copied; every rank decides alike. A table, no torch."""

from __future__ import annotations

import pytest

from nbdist.errors import ConfigError
from nbdist.heal.sync import (
    ABSENT,
    MODULE,
    OPAQUE,
    OPTIMIZER,
    TENSOR,
    VALUE,
    Copy,
    Held,
    NotCopied,
    body,
    command,
    plan,
    said,
)

NONE = Held(ABSENT)
T = Held(TENSOR, "d1", ((2, 3), "torch.float32", "cpu", False))
T2 = Held(TENSOR, "d2", ((2, 3), "torch.float32", "cpu", False))
M = Held(MODULE, "m1", (("weight", (2, 3), "torch.float32"), ("bias", (2,), "torch.float32")))
M_FRESH = Held(MODULE, "m2", M.meta)  # the same module made again, other weights
M_OTHER = Held(MODULE, "m3", (("weight", (4, 3), "torch.float32"),))
OPT, OPT_FRESH = Held(OPTIMIZER, "o1"), Held(OPTIMIZER, "o2")
LOCK = Held(OPAQUE, meta=("a lock",))


@pytest.mark.parametrize(("held", "source", "to", "decided"), [
    # a restarted rank lacks it: copied from the lowest rank that keeps it
    ([T, NONE], None, None, Copy("x", TENSOR, 0, (1,), T.meta)),
    ([T, T, NONE, NONE], None, None, Copy("x", TENSOR, 0, (2, 3), T.meta)),
    ([NONE, T, T], 2, None, Copy("x", TENSOR, 2, (0,), T.meta)),
    # the restarted rank made it again (%dist_replay): --to (or the restarted ranks) copies over its own
    ([M, M_FRESH], None, [1], Copy("x", MODULE, 0, (1,), M.meta)),
    ([OPT, OPT_FRESH], None, [1], Copy("x", OPTIMIZER, 0, (1,), ())),
    ([Held(VALUE, "v1"), Held(VALUE, "v2")], None, [1], Copy("x", VALUE, 0, (1,), ())),
    # why not
    ([NONE, NONE], None, None, NotCopied("x", "no rank holds it")),
    ([T, T], None, None, NotCopied("x", "every rank holds it (--to RANKS copies it over theirs)")),
    ([T, T2, NONE], None, None, NotCopied("x", "the ranks that keep it hold different values (rank 0; rank 1): "
                                               "rank-specific state is not copied")),
    ([T, NONE], None, [0, 1], NotCopied("x", "only ranks 0,1, where it would go, hold it")),
    ([NONE, T], None, [1], NotCopied("x", "only rank 1, where it would go, holds it")),
    ([T, NONE], 1, None, NotCopied("x", "rank 1 is one it would be copied to")),
    ([T, NONE, T], 1, [0], NotCopied("x", "rank 1 does not hold it")),
    ([LOCK, NONE], None, None, NotCopied("x", "it is a lock: only tensors, numbers, text and their lists, tuples "
                                              "and dicts go to another rank")),
    ([M, NONE], None, None, NotCopied("x", "rank 1 has no module named x to load its state into: create it there "
                                           "first (%dist_replay runs again the cell that made it)")),
    ([OPT, T], None, [1], NotCopied("x", "rank 1 has no optimizer named x to load its state into: create it there "
                                       "first (%dist_replay runs again the cell that made it)")),
    ([M, M_OTHER], None, [1], NotCopied("x", "rank 1's module x has other parameters than rank 0's")),
])
def test_every_rank_decides_alike_from_what_each_holds(held, source, to, decided):
    assert plan("x", held, source, to) == decided


def test_each_rank_says_what_it_did_and_a_rank_with_no_part_says_nothing():
    step = Copy("w", TENSOR, 0, (1, 2), T.meta)
    assert said(step, 0) == "w: sent to ranks 1,2"
    assert said(step, 1) == said(step, 2) == "w: copied from rank 0 (tensor 2x3 float32)"
    assert said(Copy("w", TENSOR, 0, (2,), T.meta), 1) is None
    assert said(NotCopied("w", "no rank holds it"), 1) == "w: not copied: no rank holds it"


@pytest.mark.parametrize(("names", "source", "to", "restarted", "sent"), [
    (["model", "opt"], None, None, [], body(["model", "opt"], None, None)),
    (["model"], "0", None, [1], body(["model"], 0, [1])),  # the workers started again, by default
    (["t"], None, "1,3", [1], body(["t"], None, [1, 3])),
])
def test_the_magics_line_becomes_one_body_every_rank_runs(names, source, to, restarted, sent):
    assert command(names, source, to, 4, restarted) == sent


@pytest.mark.parametrize(("names", "source", "to", "why"), [
    (["model.fc"], None, None, "%dist_sync copies names of the notebook's namespace, not 'model.fc'"),
    (["class"], None, None, "%dist_sync copies names of the notebook's namespace, not 'class'"),
    (["t"], "0-1", None, "--from takes one rank, not '0-1'"),
    (["t"], "7", None, "--from: "),
    (["t"], None, "x", "--to: "),
])
def test_a_name_that_is_not_one_or_a_rank_not_in_the_world_is_one_line(names, source, to, why):
    with pytest.raises(ConfigError) as caught:
        command(names, source, to, 4)
    assert str(caught.value).startswith(why), caught.value
