"""Collectives that torch's own code starts from C++ (DDP's constructor): refused, stoppable, rebuilt after.

Real kernels, real TCP on loopback (issue 35). A driving notebook refuses them in a plain cell as it
refuses a plain ``dist.send``; in a peer world the stop button ends one that the other rank never joins,
and the next cells work on every rank.
"""

from __future__ import annotations

import time

import pytest

from nbdist.drive import kernels

from .conftest import free_port, ok

DDP = ("model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))\n"
       "print('built', sum(p.numel() for p in model.parameters()))\n")


@pytest.fixture
def driver():
    k = kernels.Kernel()
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        yield k
    finally:
        k.shutdown()


@pytest.mark.timeout(240)
def test_a_ddp_model_built_in_a_plain_cell_of_a_driving_notebook_is_refused_at_once(driver):
    r = driver.execute(f"%dist_init --spawn 2 --master-port {free_port()} --pg-timeout 60", timeout=180)
    assert r.status == "ok", r.error
    t0 = time.monotonic()
    refused = driver.execute(DDP, timeout=60)
    took = time.monotonic() - t0
    assert refused.status == "error" and refused.error["ename"] == "DriveError", refused.error
    assert "%%collective" in refused.error["evalue"], refused.error
    assert took < 5, f"took {took:.1f} s"
    sent = driver.execute("dist.send(torch.ones(1), dst=1)", timeout=30)  # the same refusal as a plain send
    assert sent.status == "error" and sent.error["evalue"] == refused.error["evalue"], sent.error
    # The world is intact: the same model in a %%collective is built on every rank.
    text = ok([driver.execute("%%collective\n" + DDP, timeout=120)])[0].text()
    assert "all 2 ranks (identical)" in text and "built 10" in text, text
