"""``%%collective --find-divergence`` on real kernels: one notebook driving three spawned workers (4 ranks), shared
by the module. Each cell is one of the classic ways replicas part ways, and the answer must name what a person
debugging DDP needs: the operation, its line, the ranks holding each hash."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from ..conftest import kernels, ok, plain_text, spawned_world


@pytest.fixture(scope="module")
def driving() -> Iterator[kernels.Kernel]:
    with spawned_world(4) as k:
        ok([k.execute("%%collective\nimport torch, torch.nn as nn\ntorch.manual_seed(0)", timeout=120)])
        yield k


def run(k: kernels.Kernel, body: str) -> str:
    r = k.execute(f"%%collective --find-divergence\n{body}", timeout=180)
    assert r.status == "ok", plain_text(r)
    return plain_text(r)


def answer(shown: str) -> str:
    """The comparison's text, as the table shows it once for every rank."""
    found = shown[shown.index("find-divergence:"):]
    return found


def test_dropout_drawn_with_each_ranks_own_seed_is_named_with_its_line(driving: kernels.Kernel) -> None:
    shown = run(driving, "torch.manual_seed(RANK)\n"
                         "x = torch.ones(8, 16)\n"
                         "y = nn.functional.dropout(x, 0.5)\n"
                         "print('sum', float(y.sum()) > 0)")
    assert shown.count("find-divergence:") == 1, shown
    assert re.search(r"part ways at operation #3, line 4: aten\.bernoulli_\.float → f32\[8, 16\]", shown), shown
    assert "rank 0: hash" in shown and "rank 3: hash" in shown, shown
    assert "sum True" in shown


def test_an_all_reduce_skipped_on_one_rank(driving: kernels.Kernel) -> None:
    r = driving.execute("%%collective --find-divergence\n"
                        "t = torch.ones(4) * (RANK + 1)\n"
                        "if RANK != 1:\n"
                        "    dist.all_reduce(t)\n"
                        "print(t)", timeout=180)
    shown = plain_text(r)
    assert r.status == "error", shown  # not a hang: nbdist's check of collectives catches it
    assert "ranks 0,2,3: all_reduce" in shown, shown
    assert "this rank never called" in shown, shown  # rank 1's column says what it means


def test_a_model_built_before_manual_seed_on_one_rank(driving: kernels.Kernel) -> None:
    shown = answer(run(driving, "if RANK == 2:\n"
                                "    model = nn.Linear(4, 2)\n"
                                "torch.manual_seed(1)\n"
                                "if RANK != 2:\n"
                                "    model = nn.Linear(4, 2)\n"
                                "x = torch.ones(3, 4)\n"
                                "loss = model(x).sum()"))
    # A user needs: where rank 2 parts ways, and that it is alone. Building the model draws its weights (the
    # first operations that differ); before them every rank agreed.
    assert "ranks 0-3 part ways at operation #3" in shown, shown
    assert re.search(r"ranks 0,1,3: #3 line 6: aten\.uniform_\.default → f32\[2, 4\] \(hash [0-9a-f]{16}\)\n"
                     r" +rank 2: #3 line 3: aten\.uniform_\.default", shown), shown


def test_forward_and_backward_are_covered_with_the_forward_line(driving: kernels.Kernel) -> None:
    shown = answer(run(driving, "torch.manual_seed(0)\n"
                                "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n"
                                "x = torch.ones(5, 4)\n"
                                "loss = model(x).sum() * (1 + RANK)\n"
                                "loss.backward()\n"
                                "(model[0].weight.grad.sum() == 0).item()"))
    # the forward differs only at the product: every earlier operation agreed
    assert "part ways at operation #" in shown and "line 5: aten.mul.Tensor" in shown, shown
    assert "line 5: aten.addmm.default" in shown, shown


def test_a_backward_op_names_its_forward_line(driving: kernels.Kernel) -> None:
    shown = answer(run(driving, "w = torch.ones(3, requires_grad=True)\n"
                                "h = w * 2\n"
                                "h.register_hook(lambda g: g * (1 + RANK))\n"
                                "y = h.sum()\n"
                                "y.backward()"))
    # the hook's product runs in the backward of line 3's product; the backward before it still agreed
    assert "part ways at operation #6, line 4 (backward of line 3, MulBackward0): aten.mul.Tensor" in shown, shown
    assert "#5 line 6 (backward of line 5, SumBackward0): aten.expand.default" in shown, shown


def test_everything_agrees_in_one_line(driving: kernels.Kernel) -> None:
    r = driving.execute("%%collective --find-divergence\n"
                        "torch.manual_seed(0)\n"
                        "model = nn.Linear(4, 2)\n"
                        "loss = model(torch.ones(2, 4)).sum()\n"
                        "loss.backward()\n"
                        "t = torch.ones(2)\n"
                        "dist.all_reduce(t)\n"
                        "print('body ran')\n"
                        "int(t.sum())", timeout=180)
    shown = plain_text(r)
    assert r.status == "ok", shown
    found = [line for line in shown.splitlines() if "find-divergence:" in line]
    assert len(found) == 1 and re.search(r"find-divergence: all \d+ operations agreed on ranks 0-3\.$", found[0]), shown
    assert "body ran" in shown and "8" in shown.split("find-divergence")[-1], shown  # the result, shown as usual


def test_replicas_compare_only_the_ranks_given(driving: kernels.Kernel) -> None:
    r = driving.execute("%%collective --find-divergence --replicas 0,1\n"
                        "torch.manual_seed(0 if RANK < 2 else RANK)\n"
                        "x = nn.functional.dropout(torch.ones(8), 0.5)", timeout=180)
    shown = plain_text(r)
    assert r.status == "ok", shown
    assert re.search(r"find-divergence: all \d+ operations agreed on ranks 0,1 \(--replicas\)\.", shown), shown
    assert shown.count("find-divergence:") == 1, shown  # ranks 2 and 3 print the same decided text
