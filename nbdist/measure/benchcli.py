"""``nbdist bench``: ``%dist_bench`` in a world of local kernels, its table printed and its plot written to a file.

One kernel runs ``%load_ext nbdist``, ``%dist_init --spawn N`` (it becomes rank 0 and starts N-1
worker kernels that follow it) and ``%dist_bench``, as a person in one notebook would. The table
is the cell's own text form; the plot is the PNG the cell showed.
"""

from __future__ import annotations

import ast
import base64
import os
import signal
import threading
import time
from typing import Any, TextIO

from ..config import TIMEOUTS
from ..drive import kernels

WORKER_PIDS = "sorted(get_ipython().magics_manager.registry['DistMagics'].session.workers.pids())"
BENCH_TIMEOUT = 3600.0  # seconds the bench cell may take before the command gives up on it
STOP_WAIT = 60.0  # seconds the command waits for the cell to end after Ctrl-C interrupted the kernel
GONE_WAIT = 15.0  # seconds the worker kernels get to exit after the driving kernel shut down


def run(world_size: int, line: str, plot: str, master_port: int | None, out: TextIO, err: TextIO) -> int:
    """Run ``%dist_bench LINE`` on ``world_size`` local ranks; 0 ok, 1 failed, 130 interrupted (Ctrl-C)."""
    port = f" --master-port {master_port}" if master_port else ""
    kernel: kernels.Kernel | None = None
    pids: list[int] = []
    code = 1
    try:
        (kernel,) = kernels.start(1)
        loaded = kernel.execute("%load_ext nbdist", timeout=60)
        init = kernel.execute(f"%dist_init --spawn {world_size}{port}", timeout=TIMEOUTS["join"], user_expressions={
            "port": "__import__('os').environ.get('MASTER_PORT')", "pids": WORKER_PIDS})
        for step, result in (("%load_ext nbdist", loaded), (f"%dist_init --spawn {world_size}{port}", init)):
            if result.status != "ok":
                print(f"nbdist bench: {step} failed: {_error_line(result)}", file=err)
                return 1
        pids = ast.literal_eval(init.expression("pids"))
        where = f"127.0.0.1:{ast.literal_eval(init.expression('port'))}"
        print(f"nbdist bench: a world of {world_size} ranks on {where} (one kernel and {world_size - 1} worker "
              f"kernel(s)): %dist_bench {line}".rstrip(), file=out, flush=True)
        result, interrupted = _execute_interruptibly(kernel, f"%dist_bench {line}".rstrip())
        for shown in _tables(result):
            print(shown, file=out)
        if interrupted:
            print("nbdist bench: interrupted (Ctrl-C); the table above holds the sizes measured so far", file=err)
            code = 130
        elif result.status != "ok":
            print(f"nbdist bench: {_error_line(result)}", file=err)
        else:
            pngs = result.displays("image/png")
            if pngs:
                with open(plot, "wb") as f:
                    f.write(base64.b64decode(pngs[0]))
                print(f"nbdist bench: plot written to {os.path.abspath(plot)}", file=out)
            code = 0
    except KeyboardInterrupt:
        print("nbdist bench: interrupted (Ctrl-C) before the bench began", file=err)
        code = 130
    except Exception as exc:  # the command's one line: kernels that would not start, a cell that never ended
        print(f"nbdist bench: {type(exc).__name__}: {exc}", file=err)
        code = 1
    finally:
        if kernel is not None:
            kernel.shutdown()  # its worker kernels stop with it
        left = _still_running(pids, GONE_WAIT)
        if left:
            print(f"nbdist bench: worker kernel(s) {', '.join(map(str, left))} still ran {GONE_WAIT:g} s after the "
                  "world shut down; killed them", file=err)
            _kill(left)
            code = code or 1
        elif pids:
            print(f"nbdist bench: shut down; worker kernel pid(s) {', '.join(map(str, pids))} exited", file=out)
    return code


def _execute_interruptibly(kernel: kernels.Kernel, code: str) -> tuple[kernels.Result, bool]:
    """Run ``code`` in ``kernel``; Ctrl-C here interrupts the kernel, then waits (bounded) for the cell to end."""
    box: dict[str, Any] = {}
    done = threading.Event()  # waited on, not Thread.join: an interrupted join can leave is_alive() wrong

    def target() -> None:
        try:
            box["result"] = kernel.execute(code, timeout=BENCH_TIMEOUT)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="nbdist-bench", daemon=True).start()
    interrupted = False
    deadline = time.monotonic() + BENCH_TIMEOUT + STOP_WAIT
    while not done.is_set() and time.monotonic() < deadline:
        try:
            done.wait(0.2)
        except KeyboardInterrupt:
            if not interrupted:
                interrupted = True
                kernel.interrupt()
                deadline = min(deadline, time.monotonic() + STOP_WAIT)
    if not done.is_set():
        raise TimeoutError(f"the bench cell did not end ({'after Ctrl-C' if interrupted else 'in time'})")
    if "error" in box:
        raise box["error"]
    return box["result"], interrupted


def _tables(result: kernels.Result) -> list[str]:
    """The text the cell displayed (the table, or a note), without the plot and the Out line."""
    shown = [o["content"]["data"] for o in result.shown() if o["msg_type"] == "display_data"]
    return [data["text/plain"] for data in shown if "image/png" not in data and "text/plain" in data]


def _error_line(result: kernels.Result) -> str:
    error = result.error or {}
    return f"{error.get('ename', 'error')}: {error.get('evalue', '')}".rstrip(": ")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _still_running(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if _alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
