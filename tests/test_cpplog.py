"""nbdist.backend.cpplog: torch's C++ log level set before torch loads, never over the user's; a note when too late."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbdist.backend import cpplog

from .conftest import skip_or_fail_in_ci

ROOT = Path(__file__).resolve().parent.parent
HOSTNAME_LINE = "[c10d] The hostname of the client socket cannot be retrieved. err=-3"
KEY = "TORCH_CPP_LOG_LEVEL"


# --- the decision, on fake environments ---------------------------------------------------
def test_sets_the_level_when_torch_is_not_imported_and_the_user_set_nothing():
    environ: dict[str, str] = {"PATH": "/bin"}
    assert cpplog.quiet_before_torch(environ, {"os": os}) is None
    assert environ == {"PATH": "/bin", KEY: "ERROR"}


@pytest.mark.parametrize("value", ["INFO", "WARNING", "0", ""])
@pytest.mark.parametrize("modules", [{}, {"torch": object()}], ids=["torch absent", "torch imported"])
def test_never_overrides_a_value_the_user_set(value, modules):
    environ = {KEY: value}
    assert cpplog.quiet_before_torch(environ, modules) is None
    assert environ == {KEY: value}


def test_returns_a_note_and_sets_nothing_when_torch_is_already_imported():
    environ: dict[str, str] = {}
    note = cpplog.quiet_before_torch(environ, {"torch": object(), "torch.distributed": object()})
    assert environ == {}
    assert note is not None
    assert "torch was imported before %load_ext nbdist" in note
    assert "hostname of the client socket cannot be retrieved" in note and "Exception raised from" in note
    assert "restart the kernel and run %load_ext nbdist before anything imports torch" in note
    assert "set TORCH_CPP_LOG_LEVEL=ERROR before starting Jupyter" in note
    assert not note.endswith(".")  # the init summary shows it as "warning: {note}."


def test_a_failed_import_torch_counts_as_imported():
    # A failed `import torch` drops "torch" from sys.modules but keeps torch._C, which read the level already.
    note = cpplog.quiet_before_torch({}, {"torch._C": object()})
    assert note is not None and "TORCH_CPP_LOG_LEVEL=ERROR" in note


def test_a_module_merely_named_like_torch_does_not_count():
    environ: dict[str, str] = {}
    assert cpplog.quiet_before_torch(environ, {"torchvision_stub": object(), "torchx": object()}) is None
    assert environ == {KEY: "ERROR"}


def test_plan_changes_nothing():
    environ: dict[str, str] = {}
    assert cpplog.plan(environ, {}) == ({KEY: "ERROR"}, None)
    assert environ == {}


# --- real processes -----------------------------------------------------------------------
def _env() -> dict[str, str]:
    """This process's environment without anything that would set torch's log level or warning filters."""
    env = {k: v for k, v in os.environ.items() if k not in (KEY, "PYTHONWARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_importing_cpplog_does_not_import_torch():
    r = _python("import sys, nbdist.backend.cpplog; "
                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_user_and_torch_warnings_still_show_after_quiet_before_torch():
    code = """
import ctypes, os, warnings
from nbdist.backend.cpplog import quiet_before_torch
assert quiet_before_torch() is None
import torch
c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
print("level", ctypes.c_int.in_dll(c10, "FLAGS_caffe2_log_level").value, os.environ["TORCH_CPP_LOG_LEVEL"])
warnings.warn("user warning")
# TORCH_WARN in aten/src/ATen/native/Resize.cpp (resize_output), routed to Python's warnings by torch
torch.add(torch.ones(2), torch.ones(2), out=torch.empty(3))
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["level", "2", "ERROR"]  # torch really runs at ERROR here (2; its default is 1)
    assert "UserWarning: user warning" in r.stderr
    assert "UserWarning: An output with one or more elements was resized" in r.stderr
    assert "(Triggered internally at " in r.stderr  # it came from C++'s TORCH_WARN


# The hostname line appears where reverse DNS fails with a temporary error (err=-3, EAI_AGAIN), as in
# containers whose name server is unreachable. Here DNS works (or answers "no such name", which
# getnameinfo turns into a numeric address), so each process runs in a private mount namespace whose
# /etc/resolv.conf names a server that refuses (127.0.0.1:53): any address outside /etc/hosts fails at once.
_IN_BROKEN_DNS = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'

SERVER = """
import os, sys
from datetime import timedelta
if sys.argv[-1] == "quiet":
    from nbdist.backend.cpplog import quiet_before_torch
    assert quiet_before_torch() is None
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
print(store.port, flush=True)
store.wait(["done"])
"""

CLIENT = """
import sys
from datetime import timedelta
import torch.distributed as dist
dist.TCPStore("127.0.0.2", int(sys.argv[-1]), timeout=timedelta(seconds=20)).set("done", "1")
"""


def _broken_dns(resolv: Path, code: str, *args: str) -> list[str]:
    return ["unshare", "--mount", "sh", "-c", _IN_BROKEN_DNS, str(resolv), sys.executable, "-c", code, *args]


@pytest.fixture(scope="module")
def broken_dns(tmp_path_factory) -> Path:
    """A resolv.conf whose name server refuses; skips where a private mount namespace cannot use it."""
    resolv = tmp_path_factory.mktemp("dns") / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    if shutil.which("unshare") is None:
        skip_or_fail_in_ci("needs unshare(1) to give a process its own /etc/resolv.conf")
    probe = "import socket\ntry: socket.getnameinfo(('127.0.0.2', 1), 0)\nexcept socket.gaierror as e: print(e.errno)"
    r = subprocess.run(_broken_dns(resolv, probe), capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or r.stdout.strip() != str(-3):
        skip_or_fail_in_ci(f"cannot make reverse DNS fail in a private mount namespace (root needed?): "
                           f"rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    return resolv


def _store_pair(resolv: Path, mode: str) -> tuple[str, str]:
    """Run a TCPStore server (``mode`` "quiet": calling quiet_before_torch first) and a client; their stderr."""
    server = subprocess.Popen(_broken_dns(resolv, SERVER, mode), cwd=ROOT, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = server.stdout.readline().strip()
        assert port.isdigit(), server.communicate(timeout=30)[1]
        client = subprocess.run(_broken_dns(resolv, CLIENT, port), cwd=ROOT, env=_env(), capture_output=True,
                                text=True, timeout=60)
        assert client.returncode == 0, client.stderr
        _, server_err = server.communicate(timeout=30)
        assert server.returncode == 0, server_err
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    return server_err, client.stderr


def test_quiet_before_torch_keeps_the_hostname_line_out_of_stderr(broken_dns):
    control_server, control_client = _store_pair(broken_dns, "control")
    assert HOSTNAME_LINE in control_server  # without the call, torch prints it
    assert HOSTNAME_LINE in control_client
    quiet_server, quiet_client = _store_pair(broken_dns, "quiet")
    assert HOSTNAME_LINE in quiet_client  # the client did not call it: DNS failed in this run too
    assert HOSTNAME_LINE not in quiet_server
    assert quiet_server.strip() == ""


# When the rank hosting the store dies, a rank blocked in a store wait (nbdist's watcher, heartbeat or
# rendezvous) prints "[W... TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(...)"
# and a C++ stack trace before the DistNetworkError reaches Python. No DNS trick needed.
DYING_SERVER = """
import os, signal
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
print(store.port, flush=True)
store.wait(["ready"])
os.kill(os.getpid(), signal.SIGKILL)
"""

SURVIVOR = """
import sys
from datetime import timedelta
if sys.argv[-2] == "quiet":
    from nbdist.backend.cpplog import quiet_before_torch
    assert quiet_before_torch() is None
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[-1]), timeout=timedelta(seconds=20))
store.set("ready", "1")
try:
    store.wait(["never"])
except dist.DistNetworkError as exc:
    print("raised", type(exc).__name__)
"""


def _survivor_stderr(mode: str) -> str:
    server = subprocess.Popen([sys.executable, "-c", DYING_SERVER], cwd=ROOT, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        port = server.stdout.readline().strip()
        assert port.isdigit(), f"the store server printed {port!r}"
        r = subprocess.run([sys.executable, "-c", SURVIVOR, mode, port], cwd=ROOT, env=_env(), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "raised DistNetworkError", (r.stdout, r.stderr)
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate()
    return r.stderr


def test_quiet_before_torch_keeps_the_store_failure_trace_out_of_stderr():
    control = _survivor_stderr("control")
    assert "[c10d] recvValueWithTimeout failed on SocketImpl" in control
    assert "Exception raised from recvBytes" in control
    assert _survivor_stderr("quiet").strip() == ""
