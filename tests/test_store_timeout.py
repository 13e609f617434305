"""Process groups meet through a store that waits as long as the process-group timeout, not one store operation.

nbdist hands torch its own store (``init_process_group(store=PrefixStore(prefix, RecordingStore(...)))``).
Torch gives a store the process-group timeout only when it makes the store itself, so nbdist's store
must carry that timeout: the store client's per-operation limit (``nbdist.world.store.OP_TIMEOUT``, 10 s)
would fail any rank that reaches group set-up more than 10 s after another.

NCCL and HCCL set up a communicator at its first collective: rank 0 ``set``s the unique id and the
others ``store->get`` it, with no timeout of their own, so the store's default decides how late rank 0
may be. gloo sets up eagerly (``init_process_group``, ``new_group``) but passes the group's timeout to
every ``wait`` itself, so a late gloo rank shows the behaviour without testing the store's default;
a plain ``get`` on the store torch was handed does, and runs on CPU.

The kernels here lower that per-operation limit to ``SHORT_OP_TIMEOUT`` (4 s) before they join, so a rank
need be only 7 s late, not 13, to outlast one store operation: what is proven is the same, the gap larger
than the limit every store client of the kernel has (the test checks the kernel's own client has it).
"""

from __future__ import annotations

import ast
import time

import pytest

from nbdist.drive import kernels

from .conftest import init_line, run_in_background

SHORT_OP_TIMEOUT = 4.0  # the kernels' nbdist.world.store.OP_TIMEOUT (10 s as shipped), set before they join
SHORTEN = f"import nbdist.world.store as _store\n_store.OP_TIMEOUT = {SHORT_OP_TIMEOUT}\n"
OWN_TIMEOUT = "get_ipython().magics_manager.registry['DistMagics'].session.client.raw().timeout.total_seconds()"
GAP = SHORT_OP_TIMEOUT + 3.0  # seconds between the ranks reaching group set-up: more than one store operation may take
ALL_REDUCE = "%%collective --timeout 60\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"
# Unchecked, rank 0 waits inside gloo's all_reduce while rank 1 fails: nbdist must cut the group.
FAIL_WHILE_WAITING = (
    "%%collective --timeout 60 --no-check\nimport time\nif RANK == 1:\n    time.sleep(0.5)\n"
    "    raise ValueError('rank 1 broke')\ndist.all_reduce(torch.ones(1))\n"
)
NEW_GROUP_ALL_REDUCE = (
    "import torch, torch.distributed as dist\ng = dist.new_group([0, 1])\n"
    "t = torch.ones(1)\ndist.all_reduce(t, group=g)\nt.item()\n"
)

# What NCCL and HCCL do at set-up: one rank reads a key that another writes, from the store torch was handed.
STORE_GET = (
    "import torch.distributed as dist\ndist.distributed_c10d._get_default_store().get('nbdist-test/late').decode()\n"
)
STORE_SET = (
    "import torch.distributed as dist\ndist.distributed_c10d._get_default_store().set('nbdist-test/late', 'late')\n"
)


def ok(results: list[kernels.Result]) -> list[kernels.Result]:
    for rank, r in enumerate(results):
        assert r.status == "ok", f"rank {rank}: {r.error}"
    return results


def value(kernel: kernels.Kernel, expression: str) -> object:
    r = kernel.execute("", timeout=60, user_expressions={"v": expression})
    return ast.literal_eval(r.expression("v"))


def world_with_a_cut_group(start_kernels, port: int) -> list[kernels.Kernel]:
    """Two gloo kernels in one world whose process group a failure has just cut; their store operations are
    limited to ``SHORT_OP_TIMEOUT``."""
    ks = start_kernels(2)
    ok(kernels.execute_all(ks, SHORTEN, timeout=60))
    ok(kernels.execute_all(ks, [init_line(i, 2, port) for i in range(2)], timeout=120))
    assert [value(k, OWN_TIMEOUT) for k in ks] == [SHORT_OP_TIMEOUT] * 2  # the limit the gap must outlast
    for r in kernels.execute_all(ks, FAIL_WHILE_WAITING, timeout=120):
        assert r.status == "error", r.text()
        text = r.text()
        assert "cannot be trusted after this cell" in text and "rebuilds it at the next %%collective" in text, text
    return ks


def one_rank_late(
    ks: list[kernels.Kernel], code: str | tuple[str, str], first: int = 0
) -> tuple[kernels.Result, kernels.Result, float]:
    """Run ``code`` on rank ``first``, then on the other rank ``GAP`` s later.

    ``code`` may be one cell for both ranks or (rank 0's, rank 1's). Returns rank 0's and
    rank 1's results and how long the first rank's cell took.
    """
    codes = (code, code) if isinstance(code, str) else code
    late = 1 - first
    started = time.monotonic()
    thread, box = run_in_background(ks[first], codes[first], timeout=120)
    time.sleep(GAP)
    if "r" in box or "exc" in box:
        why = box["r"].error if "r" in box else repr(box["exc"])
        pytest.fail(f"rank {first} did not wait for rank {late}, it ended within {GAP} s: {why}")
    r_late = ks[late].execute(codes[late], timeout=120)
    thread.join(timeout=120)
    assert "exc" not in box, f"rank {first}: {box['exc']!r}"
    assert "r" in box, f"rank {first}'s cell did not end within 120 s"
    results = (box["r"], r_late) if first == 0 else (r_late, box["r"])
    return results[0], results[1], box["t"] - started


@pytest.mark.timeout(300)
def test_after_a_failure_ranks_may_reach_the_rebuild_a_new_group_and_the_stores_waits_far_apart(start_kernels, port):
    """Each step has one rank 7 s late: more than ``OP_TIMEOUT`` (here 4 s), the store client's limit for one
    operation, so no wait on the way may be bounded by that limit. One world, as the steps build on each other.

    1. After a failure cut the group, rank 1 enters the ``%%collective`` that rebuilds it 7 s after rank 0:
       rank 0 waits at the cell's start barrier (the cell's ``--timeout``), then both rebuild and all_reduce.
    2. Plain cells make a gloo ``new_group`` and all_reduce on it, rank 1 arriving 7 s after rank 0: gloo
       connects the ranks at once through the rebuilt group's store (gloo bounds this wait itself, by the
       group's timeout, so this step alone would not catch a store with a short default).
    3. Rank 1 ``get``s a key from the store torch was handed; rank 0 sets it 7 s later. This is what NCCL and
       HCCL do when they set up a communicator at the first collective (rank 0 sets the unique id, the others
       ``store->get`` it with no timeout of their own), so the store's default decides: this passes only if
       that store waits as long as the process-group timeout, as a store torch made itself would.
    """
    assert GAP > SHORT_OP_TIMEOUT + 2  # the point of the test: the gap must outlast one store operation
    ks = world_with_a_cut_group(start_kernels, port)

    r0, r1, waited = one_rank_late(ks, ALL_REDUCE)
    for r in ok([r0, r1]):
        assert "the process group was rebuilt before this cell" in r.text() and "2.0" in r.text(), r.text()
    assert waited >= GAP - 1, f"rank 0's rebuilding cell took {waited:.1f} s: it cannot have waited for rank 1"

    r0, r1, waited = one_rank_late(ks, NEW_GROUP_ALL_REDUCE)
    ok([r0, r1])
    assert [value(k, "t.item()") for k in ks] == [2.0, 2.0]
    assert waited >= GAP - 1, f"rank 0's new_group cell took {waited:.1f} s: it cannot have waited for rank 1"

    r0, r1, waited = one_rank_late(ks, (STORE_SET, STORE_GET), first=1)
    ok([r0, r1])
    assert "'late'" in r1.text(), r1.text()
    assert waited >= GAP - 1, f"rank 1's get took {waited:.1f} s: it cannot have waited for rank 0"
