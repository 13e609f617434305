"""Backend choice, environment plans and the doctor, in real kernels and through the CLI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nbdist import kernels

from .conftest import init_line, skip_or_fail_in_ci

NBDIST = [sys.executable, "-m", "nbdist.cli"]

# Each test that uses the module's kernel gets it back as it was after %load_ext.
pytestmark = pytest.mark.usefixtures("fresh_shared_kernel")


@pytest.fixture(scope="module")
def kernel():
    (k,) = kernels.start(1)
    assert k.execute("%load_ext nbdist").status == "ok"
    yield k
    k.shutdown()


@pytest.mark.parametrize(("backend", "reason"), [("hccl", "torch_npu is not installed"), ("nccl", "no CUDA")])
def test_a_backend_that_cannot_work_here_is_a_short_error(kernel, port, backend, reason):
    r = kernel.execute(init_line(0, 1, port, f"--backend {backend}"), timeout=60)
    assert r.status == "error" and r.error["ename"] == "UsageError"
    assert f"--backend {backend} cannot work here" in r.error["evalue"] and reason in r.error["evalue"]
    assert "Traceback" not in r.text()


def test_the_summary_says_which_backend_and_why_and_what_was_set(kernel, port):
    r = kernel.execute(init_line(0, 1, port, "--debug"), timeout=60)
    assert r.status == "ok", r.error
    text = r.text()
    assert "backend: gloo" in text and "torch_npu is not installed; no CUDA" in text
    assert "GLOO_SOCKET_IFNAME=lo" in text and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in text
    r = kernel.execute("import os; (os.environ['GLOO_SOCKET_IFNAME'], os.environ['TORCH_DISTRIBUTED_DEBUG'])")
    assert "('lo', 'DETAIL')" in r.text()
    r = kernel.execute("%dist_env")
    assert r.status == "ok" and "GLOO_SOCKET_IFNAME=lo" in r.text()
    r = kernel.execute("import os; os.getpid()")
    kernel_pid = int(r.text().strip())
    r = kernel.execute("%dist_doctor")
    assert r.status == "ok"
    text = r.text()
    assert f"TCP to 127.0.0.1:{port}: an nbdist server answers" in text
    # The kernel hosts the server, so the doctor names it as the holder of the master port.
    holder = [line for line in text.splitlines() if f"local port {port}:" in line]
    assert len(holder) == 1, text
    assert f"local port {port}: in use by pid {kernel_pid}: " in holder[0] and "ipykernel" in holder[0], holder[0]
    assert "torch versions" in text and "nbdist doctor: all checks passed" in text
    assert kernel.execute("%dist_destroy").status == "ok"


@pytest.mark.timeout(120)
def test_values_that_must_agree_are_compared_at_join(start_kernels, port):
    ks = start_kernels(2)
    codes = [init_line(0, 2, port, "--env HCCL_BUFFSIZE=200"), init_line(1, 2, port, "--env HCCL_BUFFSIZE=400")]
    results = kernels.execute_all(ks, codes, timeout=60)
    for r in results:
        assert r.status == "error" and r.error["ename"] == "JoinError", r.error
        assert "HCCL_BUFFSIZE differs between ranks" in r.error["evalue"]
        assert "rank(s) 0: 200" in r.error["evalue"] and "rank(s) 1: 400" in r.error["evalue"]
    results = kernels.execute_all(ks, [init_line(i, 2, port) for i in range(2)], timeout=60)
    assert all(r.status == "ok" for r in results), [r.error for r in results]


def test_nbdist_env_prints_the_hccl_plan_without_npus():
    proc = subprocess.run([*NBDIST, "env", "--backend", "hccl", "--rank", "1", "--world-size", "2",
                           "--master-addr", "127.0.0.1", "--env", "HCCL_BUFFSIZE=300"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stdout.splitlines() if not x.startswith("#")]
    assert "HCCL_IF_IP=127.0.0.1" in lines and "HCCL_CONNECT_TIMEOUT=600" in lines
    assert "HCCL_BUFFSIZE=300" in lines and "HCCL_WHITELIST_DISABLE=1" in lines
    # Shell-sourceable.
    sourced = subprocess.run(["bash", "-c", f"set -a; source <({' '.join(NBDIST)} env --backend hccl "
                              "--master-addr 127.0.0.1); set +a; echo $HCCL_IF_IP $HCCL_CONNECT_TIMEOUT"],
                             capture_output=True, text=True, timeout=60)
    assert sourced.stdout.split() == ["127.0.0.1", "600"], sourced.stderr


def test_nbdist_env_rejects_bad_values_in_one_line():
    proc = subprocess.run([*NBDIST, "env", "--backend", "hccl", "--master-addr", "127.0.0.1",
                           "--env", "HCCL_CONNECT_TIMEOUT=30"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "HCCL_CONNECT_TIMEOUT must be in 120..7200" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_doctor_names_the_process_holding_the_master_port(port):
    holder = subprocess.Popen([sys.executable, "-c", f"import socket,time; s=socket.socket(); "
                               f"s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(60)  # holder"])
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        t0 = time.monotonic()
        proc = subprocess.run([*NBDIST, "doctor", "--master-addr", "127.0.0.1", "--master-port", str(port)],
                              capture_output=True, text=True, timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 1
        assert f"local port {port}: in use by pid {holder.pid}" in proc.stdout and "# holder" in proc.stdout
        assert "not an nbdist server" in proc.stdout or "never answered" in proc.stdout
    finally:
        holder.kill()
        holder.wait()


TORCH_NPU_VERSION = "2.13.0"


def torch_npu_problem(folder: Path) -> str | None:
    """Why ``folder`` does not hold the unpacked torch_npu 2.13.0 wheel, or None if it does."""
    if not (folder / "torch_npu" / "__init__.py").is_file():
        return f"{folder} has no torch_npu/__init__.py"
    metadata = folder / f"torch_npu-{TORCH_NPU_VERSION}.dist-info" / "METADATA"
    if not metadata.is_file():
        return f"{folder} has no torch_npu-{TORCH_NPU_VERSION}.dist-info/METADATA"
    if f"Version: {TORCH_NPU_VERSION}" not in metadata.read_text(errors="replace").splitlines():
        return f"{metadata} does not say Version: {TORCH_NPU_VERSION}"
    return None


@pytest.fixture(scope="module")
def torch_npu_dir() -> Path:
    """The real torch_npu 2.13.0 wheel, unpacked into a folder (never into the test environment).

    A cached folder is used only if it holds that wheel; otherwise the wheel is fetched into a
    fresh folder, checked, and put in the cache's place. Under CI, failing to get it fails the test.
    """
    default = Path.home() / ".cache" / f"nbdist-torch-npu-{TORCH_NPU_VERSION}"
    cache = Path(os.environ.get("NBDIST_TORCH_NPU_DIR") or default)
    cached_problem = torch_npu_problem(cache)
    if cached_problem is None:
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f"{cache.name}.", dir=cache.parent))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(fresh),
                           f"torch-npu=={TORCH_NPU_VERSION}"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        skip_or_fail_in_ci(f"could not fetch the torch_npu {TORCH_NPU_VERSION} wheel "
                           f"(cache: {cached_problem}): {proc.stderr.strip()[-300:]}")
    fetched_problem = torch_npu_problem(fresh)
    if fetched_problem is not None:
        shutil.rmtree(fresh, ignore_errors=True)
        skip_or_fail_in_ci(f"the fetched torch_npu wheel is not usable: {fetched_problem}")
    shutil.rmtree(cache, ignore_errors=True)  # an invalid cache: replaced by the wheel just checked
    try:
        fresh.rename(cache)
    except OSError:  # another run put one there meanwhile: use ours
        return fresh
    return cache


@pytest.mark.timeout(300)
def test_torch_npu_without_cann_falls_back_to_gloo_and_import_torch_still_works(torch_npu_dir, port):
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(torch_npu_dir), os.environ.get("PYTHONPATH")]))}
    # Without nbdist, torch_npu without CANN breaks `import torch`: the fixture is real.
    plain = subprocess.run([sys.executable, "-c", "import torch"], env={**os.environ, **env},
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "torch_npu" in plain.stderr
    (k,) = kernels.start(1, env=env)
    try:
        assert k.execute("%load_ext nbdist").status == "ok"
        r = k.execute(init_line(0, 1, port), timeout=120)
        assert r.status == "ok", r.error
        assert "backend: gloo" in r.text()
        assert "torch_npu is installed but the CANN library libhccl.so was not found" in r.text()
        r = k.execute("import torch; t = torch.ones(2); t.sum().item()")
        assert r.status == "ok" and "2.0" in r.text(), r.error
        r = k.execute("%%collective\nt = torch.ones(1); dist.all_reduce(t); t.item()\n", timeout=60)
        assert r.status == "ok", r.error
        r = k.execute(init_line(0, 1, port, "--backend hccl"), timeout=60)
        assert r.status == "error" and r.error["ename"] == "UsageError" and "CANN" in r.error["evalue"]
    finally:
        k.shutdown()

