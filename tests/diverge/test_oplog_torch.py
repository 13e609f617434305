"""What ``%%collective --find-divergence`` takes from torch's private ``DebugMode``, pinned on the torch installed:
every dispatched operation of a forward, backward and optimizer step reaches the log hook, with autograd's node."""

from __future__ import annotations

import torch

from nbdist.diverge.oplog import OpLog, recorded, tensor_digest


def test_a_training_step_is_recorded_forward_backward_and_optimizer() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    log = OpLog()
    with recorded(log):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    names = [op.name for op in log.ops]
    assert "aten.addmm.default" in names and "aten.threshold_backward.default" in names
    assert "aten._foreach_add_.List" in names  # returns nothing: its digest is of what it wrote
    assert all(op.digest is not None for op in log.ops if op.name == "aten._foreach_add_.List")
    assert {op.node for op in log.ops if op.node} >= {"AddmmBackward0", "ReluBackward0", "AccumulateGrad"}
    assert not any(name.startswith("profiler.") for name in names)


def test_recording_stops_at_its_limit_and_the_body_runs_on() -> None:
    log = OpLog(limit=10)
    with recorded(log):
        t = torch.zeros(3)
        for _ in range(50):
            t = t + 1
    assert len(log) == 10 and log.unrecorded == 41 and t.tolist() == [50.0] * 3


def test_a_digest_sees_every_bit_and_every_position() -> None:
    a = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert tensor_digest(a) == tensor_digest(a.clone())
    assert tensor_digest(a) != tensor_digest(a.flip(0))  # the same values elsewhere
    assert tensor_digest(a) != tensor_digest(a + 1e-7)
    assert tensor_digest(a) != tensor_digest(a.double())
