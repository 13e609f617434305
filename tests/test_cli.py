"""The nbdist command: the demo end to end, and a standalone server."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from nbdist.drive import kernels
from nbdist.world.store import connect

from .conftest import init_line, start_serve

NBDIST = [sys.executable, "-m", "nbdist.cli"]


@pytest.mark.timeout(300)
def test_demo_runs_the_walkthrough_and_exits_zero(port):
    proc = subprocess.run([*NBDIST, "demo", "--port", str(port)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "nbdist demo: all expectations hold" in out
    for step in ("AllReduce", "Broadcast", "AllGather", "DDP training"):
        assert f"PASS  {step}" in out
    assert "FAIL" not in out
    assert "── rank 0 " in out and "── rank 1 " in out  # the side-by-side results, in the terminal


@pytest.fixture
def served(port):
    proc = start_serve(port)
    yield proc
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_a_standalone_server_hosts_the_world(served, reused_kernels, port):
    marker = connect("127.0.0.1", port).get_json("server")
    assert marker["pid"] == served.pid
    ks = reused_kernels(2)
    results = kernels.execute_all(ks, [init_line(i, 2, port) for i in range(2)], timeout=60)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    r = ks[0].execute("import nbdist; get_ipython().magics_manager.registry['DistMagics'].session.server")
    assert r.text().strip() == "", "rank 0 started its own server although one answered"
    for r in kernels.execute_all(ks, "%%collective\nt = torch.ones(1); dist.all_reduce(t); t.item()\n", timeout=60):
        assert r.status == "ok" and "2.0" in r.text()


@pytest.mark.timeout(120)
def test_serve_stops_on_sigterm(served):
    served.terminate()
    assert served.wait(timeout=30) == 0
    assert "server stopped" in served.stdout.read()


@pytest.mark.timeout(120)
def test_a_store_that_is_not_nbdists_is_refused(start_kernels, port):
    import torch.distributed as dist

    foreign = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                            timeout=timedelta(seconds=30))
    try:
        (k,) = start_kernels(1)
        r = k.execute(init_line(1, 2, port, "--timeout 30"), timeout=90)
        assert r.status == "error" and r.error["ename"] == "NotNbdistServerError", r.error
        assert "not an nbdist server" in r.error["evalue"] and "--master-port" in r.error["evalue"]
    finally:
        del foreign


def test_the_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "nbdist")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "nbdist" in proc.stdout


def test_help_lists_every_command():
    exe = os.path.join(os.path.dirname(sys.executable), "nbdist")
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("demo", "run", "bench", "serve", "env", "doctor", "stop"):
        assert command in proc.stdout
    assert "%dist_stop" in proc.stdout  # argparse's %-formatting must not eat the magic's name
