"""Backend choice, environment plans and the doctor, in real kernels and through the CLI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nbdist.drive import kernels

from .conftest import REAPER, init_line, skip_or_fail_in_ci

NBDIST = [sys.executable, "-m", "nbdist.cli"]

# Each test that uses the module's kernel gets it back as it was after %load_ext.
pytestmark = pytest.mark.usefixtures("fresh_shared_kernel")


@pytest.fixture(scope="module")
def kernel():
    (k,) = kernels.start(1)
    assert k.execute("%load_ext nbdist").status == "ok"
    yield k
    REAPER.later([k])


@pytest.mark.parametrize(("backend", "reason"), [("hccl", "torch_npu is not installed"), ("nccl", "no CUDA")])
def test_a_backend_that_cannot_work_here_is_a_short_error(kernel, port, backend, reason):
    r = kernel.execute(init_line(0, 1, port, f"--backend {backend}"), timeout=60)
    assert r.status == "error" and r.error["ename"] == "UsageError"
    assert f"--backend {backend} cannot work here" in r.error["evalue"] and reason in r.error["evalue"]
    assert "Traceback" not in r.text()


def test_the_summary_says_which_backend_and_why_and_what_was_set(kernel, port):
    r = kernel.execute(init_line(0, 1, port, "--debug --env A_B=1 --env C_D=2"), timeout=60)
    assert r.status == "ok", r.error
    text = r.text()
    assert "backend: gloo" in text and "torch_npu is not installed; no CUDA" in text
    assert "GLOO_SOCKET_IFNAME=lo" in text and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in text
    r = kernel.execute("import os; (os.environ['GLOO_SOCKET_IFNAME'], os.environ['TORCH_DISTRIBUTED_DEBUG'])")
    assert "('lo', 'DETAIL')" in r.text()
    r = kernel.execute("%dist_env")  # this world's plan: its own --debug and --env flags included
    assert r.status == "ok", r.error
    lines = r.text().splitlines()
    assert {"GLOO_SOCKET_IFNAME=lo", "TORCH_DISTRIBUTED_DEBUG=DETAIL", "A_B=1", "C_D=2"} <= set(lines), r.text()
    r = kernel.execute("%dist_env --env E_F=3")  # flags given here replace the world's
    assert "E_F=3" in r.text().splitlines() and "A_B=1" not in r.text().splitlines(), r.text()
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
def test_values_that_must_agree_are_compared_at_join(reused_kernels, port):
    ks = reused_kernels(2)
    codes = [init_line(0, 2, port, "--env HCCL_BUFFSIZE=200"), init_line(1, 2, port, "--env HCCL_BUFFSIZE=400")]
    results = kernels.execute_all(ks, codes, timeout=60)
    for r in results:
        assert r.status == "error" and r.error["ename"] == "JoinError", r.error
        assert "HCCL_BUFFSIZE differs between ranks" in r.error["evalue"]
        assert "rank 0: 200" in r.error["evalue"] and "rank 1: 400" in r.error["evalue"]
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
        # The plan names the error-handling variable this torch_npu reads, found in its own library.
        r = k.execute("%dist_env --backend hccl --master-addr 127.0.0.1", timeout=60)
        assert r.status == "ok", r.error
        lines = r.text().splitlines()
        assert "TORCH_HCCL_ASYNC_ERROR_HANDLING=2" in lines, r.text()
        assert not [x for x in lines if x.startswith("HCCL_ASYNC_ERROR_HANDLING=")], r.text()
        assert f"torch_npu {TORCH_NPU_VERSION} reads TORCH_HCCL_ASYNC_ERROR_HANDLING" in r.text()
    finally:
        REAPER.later([k])


def _stub_cann(folder: Path) -> dict[str, str]:
    """Stand-ins for what no machine here has: CANN's three libraries (empty) and an `npu-smi`.

    The fake npu-smi reports NBDIST_FAKE_NPUS devices of kind 910B3. The libraries only have to load;
    nothing calls into them, as nbdist never imports torch_npu to detect NPUs.
    """
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        skip_or_fail_in_ci("no C compiler to build stand-in CANN libraries")
    lib, bin_ = folder / "lib", folder / "bin"
    lib.mkdir()
    bin_.mkdir()
    (folder / "stub.c").write_text("void nbdist_stub(void) {}\n")
    for name in ("libhccl.so", "libascend_hal.so", "libascendcl.so"):
        subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib / name), str(folder / "stub.c")], check=True)
    smi = bin_ / "npu-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'n="${NBDIST_FAKE_NPUS:-0}"\n'
        'if [ "$2" = "-l" ]; then echo "        Total Count                    : $n"; exit 0; fi\n'
        'echo "| NPU   Name                | Health        | Power(W)    Temp(C)           |"\n'
        'i=0; while [ "$i" -lt "$n" ]; do\n'
        '  echo "| $i     910B3               | OK            | 93.6        40                |"; i=$((i+1))\n'
        "done\n")
    smi.chmod(0o755)
    return {"LD_LIBRARY_PATH": str(lib), "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.timeout(300)
def test_hccl_is_chosen_only_when_an_npu_is_visible_and_a_broken_torch_npu_never_breaks_import_torch(
        torch_npu_dir, tmp_path, port):
    base = {**os.environ, "PYTHONPATH": str(torch_npu_dir), **_stub_cann(tmp_path)}
    base.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    base.pop("ASCEND_HOME_PATH", None)

    def doctor(**extra: str) -> str:
        proc = subprocess.run([*NBDIST, "doctor", "--master-addr", "127.0.0.1", "--master-port", str(port)],
                              env={**base, **extra}, capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.stdout

    cases = [{"NBDIST_FAKE_NPUS": "0"},
             {"NBDIST_FAKE_NPUS": "1", "ASCEND_HOME_PATH": str(tmp_path / "no-cann")},
             {"NBDIST_FAKE_NPUS": "0", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}]
    with ThreadPoolExecutor(max_workers=2) as pool:  # three doctors, each mostly importing torch on one core
        no_npu, no_cann, autoload = pool.map(lambda extra: doctor(**extra), cases)
    # Libraries found, but no NPU visible: not hccl (finding the libraries proves nothing).
    assert "[FAIL] NPUs: torch_npu and CANN are present but no NPU is visible (npu-smi)" in no_npu, no_npu
    # torch_npu's own package check would raise: said, and `import torch` (the doctor's) still works.
    assert "torch_npu's own CANN check would fail at import: ASCEND_HOME_PATH is" in no_cann, no_cann
    # Autoload forced on where torch_npu cannot load: warned, and turned off.
    assert "[warn] TORCH_DEVICE_BACKEND_AUTOLOAD: set to 1, but torch_npu cannot load here" in autoload, autoload
    # One 910B3 visible: auto picks hccl, validates for Atlas A2 and names the variable torch_npu 2.13 reads.
    # (Autoload off by hand: the stand-in libraries cannot really load torch_npu.)
    proc = subprocess.run([*NBDIST, "env", "--master-addr", "127.0.0.1", "--env", "HCCL_EXEC_TIMEOUT=100000"],
                          env={**base, "NBDIST_FAKE_NPUS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "backend hccl" in proc.stdout and "process-group timeout 100060 s" in proc.stdout, proc.stdout
    assert "1 NPU(s) (910B3, Atlas A2 training)" in proc.stdout
    assert "TORCH_HCCL_ASYNC_ERROR_HANDLING=2" in proc.stdout.splitlines()

    # In a kernel: %load_ext sets what does not depend on the master before torch is imported.
    (k,) = kernels.start(1, env={**base, "NBDIST_FAKE_NPUS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    try:
        assert k.execute("%load_ext nbdist", timeout=60).status == "ok"
        r = k.execute("import sys, os; ('torch' in sys.modules, os.environ.get('HCCL_EXEC_TIMEOUT'), "
                      "os.environ.get('TORCH_HCCL_ASYNC_ERROR_HANDLING'), os.environ.get('HCCL_CONNECT_TIMEOUT'))")
        assert r.status == "ok" and "(False, '300', '2', '600')" in r.text(), r.text()
        assert k.execute("%unload_ext nbdist", timeout=60).status == "ok"
        r = k.execute("[os.environ.get(key) for key in ('HCCL_EXEC_TIMEOUT', 'TORCH_HCCL_ASYNC_ERROR_HANDLING')]")
        assert "[None, None]" in r.text(), r.text()  # unloading puts them back
    finally:
        REAPER.later([k])
    # A forced autoload where torch_npu cannot load is turned off, and the notebook says so.
    (k,) = kernels.start(1, env={**base, "NBDIST_FAKE_NPUS": "0", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    try:
        r = k.execute("%load_ext nbdist", timeout=60)
        assert r.status == "ok", r.error
        assert "nbdist set TORCH_DEVICE_BACKEND_AUTOLOAD=0 although it was 1" in r.text(), r.text()
        r = k.execute("import sys, os; ('torch' in sys.modules, os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'], "
                      "os.environ.get('HCCL_EXEC_TIMEOUT'))")
        assert r.status == "ok" and "(False, '0', None)" in r.text(), r.text()
        r = k.execute(init_line(0, 1, port), timeout=120)
        assert r.status == "ok", r.error
        assert "backend: gloo" in r.text() and "no NPU is visible" in r.text()
        r = k.execute("import torch; torch.ones(2).sum().item()")
        assert r.status == "ok" and "2.0" in r.text(), r.error
    finally:
        REAPER.later([k])

