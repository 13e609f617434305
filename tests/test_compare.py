"""%dist_compare and nbdist.check_replicas on real worlds (issue 48, items 1 and 3): a driven world of 4 ranks and
a peer world of 2, each formed once for the module. The last rank holds what differs; every rank says the same
answer, so the table shows it once, in its HTML and in its text."""

from __future__ import annotations

import html
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from nbdist.drive import kernels
from nbdist.ranksets import ranks_text

from .conftest import lend, ok, plain_text, spawned_world

# Every rank builds the same model and optimizer (seeded alike), then the last rank parts ways in one place each.
SETUP = """%%collective
import random
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.ones(5, 3)).sum().backward()
opt.step()
net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
net.load_state_dict(model.state_dict())
LAST = WORLD_SIZE - 1
same = torch.arange(6.0).reshape(2, 3)
odd = torch.arange(6.0).reshape(2, 3)
shaped = torch.zeros(3 if RANK == LAST else 2)
kind = [1, 2] if RANK == LAST else torch.tensor([1, 2])
cfg = {"lr": 0.1, "steps": [1, 2, {"w": torch.ones(2) * (2 if RANK == LAST else 1)}]}
if RANK != LAST:
    only = torch.ones(2)
if RANK == LAST:
    odd[1, 2] = 9.0
    with torch.no_grad():
        net[2].bias[1] += 0.5
    opt.state[model[0].weight]["exp_avg"][0, 0] += 1.0
torch.manual_seed(RANK % 2)
random.seed(0)
import numpy
numpy.random.seed(0)
"""
CHECKED = """%%collective
import nbdist
torch.manual_seed(0)
m = torch.nn.Linear(2, 2)
o = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(1, 7):
    o.zero_grad()
    m(torch.ones(1, 2)).sum().backward()
    o.step()
    if step == {parts} and RANK == WORLD_SIZE - 1:
        with torch.no_grad():
            m.bias[0] += 1.0
    try:
        nbdist.check_replicas(m, o, every={every})
    except nbdist.errors.ReplicasDifferError as e:
        print("caught:", e.step, e.entry, "|", e)
        break
else:
    print("caught: nothing")
"""


@pytest.fixture(scope="module")
def driven() -> Iterator[SimpleNamespace]:
    with spawned_world(4) as k:
        ok([k.execute(SETUP, timeout=180)])
        yield SimpleNamespace(run=lambda line: _one(k.execute(line, timeout=180)), n=4)


@pytest.fixture(scope="module")
def peers(shared) -> Iterator[SimpleNamespace]:
    for ks in lend(shared):
        ok(kernels.execute_all(ks, SETUP, timeout=120))

        def run(line: str, ks: list[kernels.Kernel] = ks) -> tuple[str, str]:
            return _one(*kernels.execute_all(ks, line, timeout=120))

        yield SimpleNamespace(run=run, n=2)


def _one(*results: kernels.Result) -> tuple[str, str]:
    """The text and HTML a cell showed, asserting it succeeded and every notebook showed the same answer."""
    ok(list(results))
    texts = [plain_text(r) for r in results]
    return texts[0], "".join(results[0].displays("text/html"))


@pytest.fixture(params=["driven", "peers"])
def world(request) -> SimpleNamespace:
    return request.getfixturevalue(request.param)


def _said_once(text: str, page: str, line: str) -> None:
    assert text.count(line) == 1, text
    assert html.escape(line, quote=False) in page or line in html.unescape(page), page


def test_alike_values_are_said_alike_on_every_rank_once(world):
    text, page = world.run("%dist_compare same net.0 cfg.lr")  # cfg.lr: an attribute path that is not there
    every = ranks_text(range(world.n))
    _said_once(text, page, f"same: alike on {every} (1 entry)")
    _said_once(text, page, f"net.0: alike on {every} (2 entries)")
    assert "cfg.lr: no rank holds it" in text, text


def test_a_differing_tensor_names_its_elements_by_rank_set(world):
    text, page = world.run("%dist_compare odd")
    last, rest = ranks_text([world.n - 1]), ranks_text(range(world.n - 1))
    _said_once(text, page, f"odd: differs: 2 groups, {rest} · {last}")
    assert f"odd: tensor 2x3 float32; elements that differ: 1 of 6 on {last}" in text, text
    assert f"[1, 2]: 5 on {rest} · 9 on {last}" in text, text
    assert f"largest difference from {rest}: 4 ({last}); relative 0.8 ({last})" in text, text


def test_a_module_with_one_differing_bias_and_an_optimizers_state_name_the_entry(world):
    text, page = world.run("%dist_compare net opt model")
    last = ranks_text([world.n - 1])
    _said_once(text, page, "1 of 4 entries differs; the first: 2.bias")
    assert f"2.bias: tensor 2 float32; elements that differ: 1 of 2 on {last}" in text, text
    assert "the first: state['0.weight'].exp_avg" in text, text  # named by the model's parameter names
    assert f"state['0.weight'].exp_avg: tensor 4x3 float32; elements that differ: 1 of 12 on {last}" in text, text
    assert f"model: alike on {ranks_text(range(world.n))} (4 entries)" in text, text


def test_a_missing_name_another_shape_and_another_kind_are_said_not_raised(world):
    text, page = world.run("%dist_compare only shaped kind")
    last, rest = ranks_text([world.n - 1]), ranks_text(range(world.n - 1))
    _said_once(text, page, f"only: missing on {last}; alike on {rest} (1 entry)")
    assert f"shaped: tensor 2 float32 on {rest} · tensor 3 float32 on {last}" in text, text
    assert f"kind: a list on {last}; alike on {rest} (1 entry)" in text, text


def test_nested_dicts_and_lists_name_the_differing_item(world):
    text, _ = world.run("%dist_compare cfg")
    last = ranks_text([world.n - 1])
    assert "1 of 4 entries differs; the first: ['steps'][2]['w']" in text, text
    assert f"elements that differ: 2 of 2 on {last}" in text, text


def test_rng_after_different_seeds_names_the_generators_that_differ(world):
    world.run("%%collective\ntorch.manual_seed(RANK % 2)\nrandom.seed(0)\nnumpy.random.seed(0)\n")  # a test may reseed
    text, _ = world.run("%dist_compare --rng")
    evens, odds = [r for r in range(world.n) if r % 2 == 0], [r for r in range(world.n) if r % 2]
    assert f"RNG states: differs: 2 groups, {ranks_text(evens)} · {ranks_text(odds)}" in text, text
    assert f"torch.initial_seed: 0 on {ranks_text(evens)} · 1 on {ranks_text(odds)}" in text, text
    assert f"torch: states differ: {ranks_text(evens)} · {ranks_text(odds)}" in text, text
    assert "random:" not in text and "numpy:" not in text, text  # seeded alike


def test_a_tolerance_counts_close_values_alike(world):
    text, _ = world.run("%dist_compare odd --atol 5")
    assert f"odd: alike within atol=5, rtol=0 on {ranks_text(range(world.n))} (1 entry, 1 not bit for bit)" in text


@pytest.mark.parametrize(("parts", "every", "step"), [(3, 1, 3), (2, 2, 3)])
def test_check_replicas_raises_at_the_first_checked_step_where_replicas_differ(world, parts, every, step):
    text, _ = world.run(CHECKED.format(parts=parts, every=every))
    last, rest = ranks_text([world.n - 1]), ranks_text(range(world.n - 1))
    assert text.count("caught:") == 1, text  # every rank raised the same error
    assert f"caught: {step} bias | the replicas differ at step {step}: bias differs: {rest} · {last};" in text, text
