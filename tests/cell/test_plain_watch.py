"""Which cells a plain-cell watch starts for, and which failures distrust the group (no kernels)."""

from __future__ import annotations

import pytest

from nbdist.cell.plain import distributed_failure, watched


@pytest.mark.parametrize("raw", ["x = 1", "\n  model = DDP(model)", "%time loss.backward()", "%%time\nx = 1", ""])
def test_a_plain_cell_is_watched(raw):
    assert watched(raw)


@pytest.mark.parametrize("raw", ["%%collective\nx = 1", "  %%dist_init --rank 0", "%dist_barrier", "%dist_follow"])
def test_nbdist_own_cells_run_turns_of_their_own_and_are_not_watched(raw):
    assert not watched(raw)


def test_a_gloo_failure_distrusts_the_group_and_a_user_error_does_not():
    import torch.distributed as dist

    assert distributed_failure(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed"))
    assert distributed_failure(dist.DistBackendError("timed out"))
    assert not distributed_failure(ZeroDivisionError("division by zero"))
    assert not distributed_failure(KeyboardInterrupt())
