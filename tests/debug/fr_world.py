"""A real two-process gloo world that ends out of step, each rank writing its Flight Recorder record.

Run as ``python -m tests.debug.fr_world RANK PORT OUT MODE``, one process per rank. The default group is
built, used, destroyed and built again under the same name (as nbdist rebuilds it), a ``new_group`` is
used, every entry so far retired (``settle``), then the ranks part: ``missing``: rank 1 skips an
``all_reduce`` that rank 0 enters; ``differs``: rank 1 calls ``broadcast`` where rank 0 calls ``all_reduce``;
``npu``: as ``missing``, read through a stand-in for torch_npu's HCCL recorder (``_dump_hccl_trace_json``,
which returns the same JSON); ``ddp``: rank 1 skips ``loss.backward()`` of a DDP model, whose gradients
rank 0 all-reduces alone. Each rank writes :func:`nbdist.debug.recorder.capture` to ``OUT/rankR.json`` and
exits without waiting for its last op.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from datetime import timedelta

import torch
import torch.distributed as dist

from nbdist.debug import recorder


def settle() -> None:
    """Until every entry so far is retired: torch retires a gloo entry a moment after it completes, and what the
    ranks completed before they part is what the tests read as completed."""
    deadline = time.monotonic() + 60
    while not all(e["retired"] for e in recorder.capture()["entries"]):
        if time.monotonic() > deadline:
            raise SystemExit(f"entries not retired after 60 s: {recorder.capture()['entries']}")
        time.sleep(0.01)


def main(rank: int, port: int, out: str, mode: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    t = torch.ones(3)
    dist.init_process_group("gloo", store=dist.PrefixStore("first", store), rank=rank, world_size=2)
    for _ in range(5):
        dist.all_reduce(t)
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore("second", store), rank=rank, world_size=2)
    side = dist.new_group([0, 1])
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0, group=side)
    dist.broadcast(t, 1, group=side)
    settle()
    if mode == "ddp":  # rank 1 skips loss.backward(): rank 0's DDP all-reduces its gradients alone
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        loss = model(torch.ones(3, 4)).sum()
        work = None
        if rank == 0:
            import threading

            threading.Thread(target=loss.backward, daemon=True).start()
            while not any(e["group"] == "0" and not e["retired"] and e["profiling_name"] == "gloo:all_reduce"
                          for e in recorder.capture()["entries"][-1:]):  # until its bucket's all_reduce began
                time.sleep(0.05)
    elif rank == 0:
        work = dist.all_reduce(t, async_op=True)  # rank 1 never joins it
    elif mode == "differs":
        work = dist.broadcast(torch.ones(5), 1, async_op=True)
    else:
        work = None
    if mode == "npu":  # read as from torch_npu's HCCL recorder: the same JSON, through torch_npu's own reader
        read = torch._C._distributed_c10d._dump_fr_trace_json  # noqa: SLF001
        sys.modules["torch_npu"] = types.SimpleNamespace(
            _C=types.SimpleNamespace(_distributed_c10d=types.SimpleNamespace(_dump_hccl_trace_json=read)))
        recorder.DUMPS = ()  # torch's own readers off: only torch_npu's answers
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(recorder.capture(), f)
    store.set(f"written/{rank}", "1")
    store.wait([f"written/{1 - rank}"])
    time.sleep(0.2)
    del work
    os._exit(0)  # the last op never completes: do not wait for it


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
