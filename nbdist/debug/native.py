"""Native frames (C++ inside gloo, NCCL or HCCL) of this process, through py-spy when it is installed.

py-spy (``pip install 'nbdist[debug]'``) reads another process's memory with
ptrace; a rank runs it on itself, from its answering thread. Where Linux's
Yama restricts ptrace to a process's ancestors (``kernel.yama.ptrace_scope``
1), the rank names py-spy as its tracer (``PR_SET_PTRACER``) for the one dump.
Whatever stops it, the answer carries the reason instead of frames.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from typing import Any

from . import stacks

TIMEOUT = 20.0  # seconds py-spy may take to dump this process
_PR_SET_PTRACER = 0x59616D61


def pyspy_path() -> str | None:
    """py-spy beside this Python (a virtual environment's bin/, not always on PATH), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def _ptrace_scope() -> str | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip()
    except OSError:
        return None


def _allow_tracer(pid: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, pid, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux, or no prctl: py-spy says so if it cannot attach
        return


def dump(threads: bool) -> dict[str, Any]:
    """This process's threads, native frames included, as :func:`nbdist.debug.stacks.capture`'s records
    (``{"threads": [...]}``), or ``{"error": why}``."""
    path = pyspy_path()
    if path is None:
        return {"error": "py-spy is not installed here (pip install 'nbdist[debug]')"}
    pid = os.getpid()
    argv = [path, "dump", "--pid", str(pid), "--json", "--native"]
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
    except OSError as exc:
        return {"error": f"py-spy could not start: {exc.strerror or exc}"}
    scope = _ptrace_scope()
    if scope == "1":
        _allow_tracer(process.pid)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": f"py-spy did not finish within {TIMEOUT:g} s"}
    finally:
        if scope == "1":
            _allow_tracer(0)
    if process.returncode != 0:
        why = (err.strip().splitlines() or [f"exit status {process.returncode}"])[-1]
        hint = (f" (kernel.yama.ptrace_scope is {scope}: only root or a process with CAP_SYS_PTRACE may attach)"
                if scope in ("2", "3") else " (it needs ptrace: in a container, CAP_SYS_PTRACE)")
        return {"error": f"py-spy could not attach: {why}{hint}"}
    try:
        found = json.loads(out)
    except ValueError:
        return {"error": "py-spy's output was not JSON"}
    return {"threads": stacks.from_pyspy(found, pid, threads)}
