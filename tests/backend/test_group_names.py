"""A build of the default group that failed on one rank alone must not put torch's group names out of step."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    from datetime import timedelta

    import torch.distributed as dist

    from nbdist.backend.procgroup import ProcessGroup, destroy_default

    store = dist.TCPStore("127.0.0.1", {port}, is_master=True, wait_for_workers=False)
    store.set_timeout(timedelta(seconds=1))
    try:  # a build whose other rank never comes (it was stopped, or failed): it fails on this rank alone
        dist.init_process_group("gloo", store=dist.PrefixStore("gone/", store), rank=0, world_size=2,
                                timeout=timedelta(seconds=1))
    except Exception as exc:
        print("the lone build failed:", type(exc).__name__)
    print("count after it:", dist.distributed_c10d._world.group_count)
    store.set_timeout(timedelta(seconds=30))
    pg = ProcessGroup("gloo", store, "next/", 0, 1, 30.0)
    print("next group's name:", dist.distributed_c10d._get_process_group_name(pg.group))
    destroy_default()
""")


def test_the_next_build_names_its_group_as_a_rank_whose_build_never_failed_would(port):
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(port=port)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "the lone build failed" in out.stdout, out.stdout
    assert "count after it: 1" in out.stdout, out.stdout  # torch's count moved on this rank alone
    assert "next group's name: 0" in out.stdout, out.stdout  # as on every rank whose build did not fail
