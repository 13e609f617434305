"""``%%collective --find-divergence`` in a peer world: two notebooks, each its own rank, each running the cell (the
module's ``shared`` world of 2). Every notebook records its own rank's operations and prints the same decided
answer, so each notebook's table shows it once."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from ..conftest import kernels, lend, ok, plain_text


@pytest.fixture(scope="module")
def peers(shared) -> Iterator[list[kernels.Kernel]]:
    for ks in lend(shared):
        ok(kernels.execute_all(ks, "%%collective\nimport torch.nn as nn", timeout=120))
        yield ks


def run(ks: list[kernels.Kernel], body: str) -> list[str]:
    """Each notebook's text of the cell ``%%collective --find-divergence`` + ``body``, run in both at once."""
    results = kernels.execute_all(ks, f"%%collective --find-divergence\n{body}", timeout=180)
    ok(results)
    return [plain_text(r) for r in results]


def test_a_dropout_seeded_by_rank_is_named_alike_in_both_notebooks(peers: list[kernels.Kernel]) -> None:
    shown = run(peers, "torch.manual_seed(0)\n"
                       "model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5))\n"
                       "torch.manual_seed(RANK)\n"
                       "model(torch.ones(3, 4)).sum().backward()")
    for text in shown:
        assert text.count("find-divergence:") == 1, text
        assert re.search(r"find-divergence: ranks 0,1 part ways at operation #\d+, line 5: aten\.bernoulli_\.float "
                         r"→ f32\[3, 8\]; its output by rank:\n +rank 0: hash [0-9a-f]{16}\n +rank 1: hash "
                         r"[0-9a-f]{16}\n", text), text
        assert "line 5: aten.addmm.default → f32[3, 8]" in text, text  # the forward before it agreed
    answers = [text[text.index("find-divergence:"):] for text in shown]
    assert answers[0] == answers[1], answers  # decided from the same gathered answers


def test_the_same_step_seeded_alike_agrees_in_one_line(peers: list[kernels.Kernel]) -> None:
    shown = run(peers, "torch.manual_seed(0)\n"
                       "model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5))\n"
                       "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                       "model(torch.ones(3, 4)).sum().backward()\n"
                       "opt.step()\n"
                       "t = torch.ones(2)\n"
                       "dist.all_reduce(t)\n"
                       "int(t.sum())")
    for text in shown:
        found = [line for line in text.splitlines() if "find-divergence:" in line]
        assert len(found) == 1 and re.search(r"find-divergence: all \d+ operations agreed on ranks 0,1\.$",
                                             found[0]), text
        assert "Out: 4" in text, text  # the body's result, shown as usual
