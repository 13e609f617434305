"""%dist_sync on a real two-rank world (issue 47, item 3): what rank 0 holds comes to rank 1, which lost it or
made it again, through torch.distributed, and what must not come (rank-specific, unpicklable, nothing to load into)
is said on every rank."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nbdist.drive import kernels

from .conftest import lend

# Rank 1 as after its kernel was started again and %dist_replay: the set-up cells ran (a model and optimizer of its
# own, other weights), the state that training and data made is gone.
SETUP = """%%collective
import threading
torch.manual_seed(RANK)
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if RANK == 0:
    t = torch.arange(6.0).reshape(2, 3).requires_grad_()
    cfg = {"lr": 0.1, "steps": [1, 2], "w": torch.ones(2)}
    model(torch.ones(1, 3)).sum().backward()
    opt.step()  # momentum buffers: rank 0's optimizer has state, rank 1's none
    lock = threading.Lock()
    head = torch.nn.Linear(3, 1)
"""
SEEN = ("(float(t.sum()), t.requires_grad, cfg['steps'], float(cfg['w'].sum()), "
        "[round(float(p.sum()), 6) for p in model.parameters()], "
        "[round(float(b.sum()), 6) for s in opt.state_dict()['state'].values() for b in s.values()])")


@pytest.fixture
def world(shared) -> Iterator[list[kernels.Kernel]]:
    yield from lend(shared, probe="%%collective\nx = 1\n")


def test_dist_sync_copies_tensors_module_and_optimizer_state_and_values_and_says_what_it_did_not(world):
    ks = world
    for res in kernels.execute_all(ks, SETUP, timeout=60):  # each peer notebook runs the same cell
        assert res.status == "ok", res.error
    results = kernels.execute_all(ks, "%dist_sync t cfg model opt lock head --to 1", timeout=120)
    for res in results:
        assert res.status == "ok", res.error
    text = results[0].text()
    assert "t: copied from rank 0 (tensor 2x3 float32)" in text and "t: sent to rank 1" in text, text
    assert "model: copied from rank 0 (module state, 2 tensor(s))" in text, text
    assert "opt: copied from rank 0 (optimizer state)" in text and "cfg: copied from rank 0 (value)" in text, text
    assert ("lock: not copied: it is a lock: only tensors, numbers, text and their lists, tuples and dicts go to "
            "another rank") in text, text
    assert ("head: not copied: rank 1 has no module named head to load its state into: create it there first "
            "(%dist_replay runs again the cell that made it)") in text, text
    seen = [k.execute("1", user_expressions={"s": SEEN}, timeout=30).expression("s") for k in ks]
    assert seen[0] == seen[1], seen  # bit for bit: equal sums, momentum buffers and all
    assert "True" in seen[1], seen  # t still requires grad
    # Every rank holds them now: nothing to copy, unless --to says where; a rank's own value is not copied.
    assert all(res.status == "ok" for res in kernels.execute_all(ks, "%%collective\nmine = RANK\n", timeout=60))
    results = kernels.execute_all(ks, "%dist_sync t mine", timeout=120)
    text = results[0].text()
    assert "t: not copied: every rank holds it (--to RANKS copies it over theirs)" in text, text
    assert "mine: not copied: every rank holds it" in text, text
    r = kernels.execute_all(ks, "%dist_sync mine --from 5", timeout=30)[0]
    assert r.status == "error" and r.error["ename"] == "UsageError" and "--from: " in r.error["evalue"], r.error
