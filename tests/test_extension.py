"""Loading, unloading, reloading; bad flags; commands before a world exists."""

from __future__ import annotations

import pytest

from nbdist.drive import kernels

from .conftest import REAPER, free_port, init_line

# Each test that uses the module's kernel gets it back as it was after %load_ext.
pytestmark = pytest.mark.usefixtures("fresh_shared_kernel")

BAD_FLAGS = [
    ("--rank 2 --world-size 2 --master-addr 127.0.0.1", "--rank must be in 0..1"),
    ("--rank 0 --world-size 0 --master-addr 127.0.0.1", "--world-size must be at least 1"),
    ("--rank 0 --world-size 2 --master-addr 127.0.0.1 --master-port 70000", "--master-port must be in 1..65535"),
    ("--rank 0 --world-size 2 --master-addr 127.0.0.1 --backend mpi", "unknown backend 'mpi'"),
    ("--rank 0 --world-size 2 --master-addr 127.0.0.1 --timeout -1", "--timeout must be positive"),
    ("--rank 0 --world-size 2", "master address is missing"),
    ("--rank 0 --world-size 2 --master-addr 127.0.0.1 --bogus 1", "unrecognized arguments"),
]


@pytest.fixture(scope="module")
def kernel():
    (k,) = kernels.start(1, env={"MASTER_ADDR": "", "RANK": "", "WORLD_SIZE": ""})
    assert k.execute("%load_ext nbdist").status == "ok"
    yield k
    REAPER.later([k])


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS)
def test_bad_flags_give_a_one_line_usage_error(kernel, flags, message):
    r = kernel.execute(f"%%dist_init {flags}", timeout=30)
    assert r.status == "error"
    assert r.error["ename"] == "UsageError", r.error
    assert message in r.error["evalue"]
    assert "\n" not in r.error["evalue"]
    assert "Traceback" not in r.text()


def test_collective_before_dist_init_says_what_to_do(kernel):
    r = kernel.execute("%%collective\nx = 1\n", timeout=30)
    assert r.status == "error" and r.error["ename"] == "NotInitializedError"
    assert "run %%dist_init" in r.error["evalue"]
    assert "Traceback" not in r.text()


def test_magic_help_is_generated(kernel):
    r = kernel.execute("%dist_init?", timeout=30)
    assert r.status == "ok"
    payload = "".join(p.get("data", {}).get("text/plain", "") for p in r.payload)
    assert "--world-size" in payload and "--master-port" in payload


def test_a_config_area_in_the_cell_body_is_used_where_flags_are_absent(kernel):
    port = free_port()
    r = kernel.execute(
        f"%%dist_init --timeout 60\nRANK = 0\nWORLD_SIZE = 1\nMASTER_ADDR = '127.0.0.1'\nMASTER_PORT = {port}\n",
        timeout=90,
    )
    assert r.status == "ok", r.error
    assert f"rendezvous 127.0.0.1:{port}" in r.text()
    r = kernel.execute("import os; (RANK, WORLD_SIZE, os.environ['MASTER_PORT'], str(DEVICE))", timeout=30)
    assert f"(0, 1, '{port}', 'cpu')" in r.text()
    assert kernel.execute("%dist_destroy").status == "ok"


@pytest.mark.timeout(120)
def test_unload_and_reload_tear_down_cleanly():
    (k,) = kernels.start(1)
    try:
        port = free_port()
        assert k.execute("%load_ext nbdist").status == "ok"
        r = k.execute(init_line(0, 1, port), timeout=60)
        assert r.status == "ok", r.error
        r = k.execute("import threading; sorted(t.name for t in threading.enumerate() if 'nbdist' in t.name)")
        assert "nbdist-heartbeat" in r.text()
        assert k.execute("%reload_ext nbdist").status == "ok"
        r = k.execute(
            "import threading, socket, torch.distributed as d\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('127.0.0.1', {port})); s.close()\n"
            "(d.is_initialized(), [t.name for t in threading.enumerate() if t.name == 'nbdist-heartbeat'])"
        )
        assert r.status == "ok", r.error  # the server's port is free again
        assert "(False, [])" in r.text()
        # Reloaded magics work: a new world on the same port.
        r = k.execute(init_line(0, 1, port), timeout=60)
        assert r.status == "ok", r.error
        r = k.execute("%%collective\nt = torch.ones(1); dist.all_reduce(t); t.item()\n", timeout=60)
        assert r.status == "ok" and "1.0" in r.text()
        # The world answers the notebook's own init_process_group while it lasts; leaving it gives torch's back.
        ours = "hasattr(torch.distributed.init_process_group, '__nbdist_original__')"
        assert k.execute(ours).text().strip() == "True"
        assert k.execute("%dist_destroy").status == "ok"
        assert k.execute(ours).text().strip() == "False"
        r = k.execute(init_line(0, 1, port), timeout=60)
        assert r.status == "ok", r.error
        assert k.execute(ours).text().strip() == "True"
        assert k.execute("%unload_ext nbdist").status == "ok"
        assert k.execute(ours).text().strip() == "False"
        # The magics are gone: IPython itself answers that it does not know them.
        r = k.execute("%%collective\nx = 1\n")
        assert r.status == "error" and r.error["ename"] == "UsageError", r.error
        assert r.error["evalue"] == "Cell magic `%%collective` not found."
        for line_magic in ("dist_status", "dist_destroy", "dist_bench", "dist_debug", "dist_dashboard"):
            r = k.execute(f"%{line_magic}")
            assert r.status == "error" and r.error["ename"] == "UsageError", r.error
            assert r.error["evalue"] == f"Line magic function `%{line_magic}` not found."
        r = k.execute("'DistMagics' in get_ipython().magics_manager.registry")
        assert r.status == "ok" and r.text().strip() == "False"
    finally:
        REAPER.later([k])
