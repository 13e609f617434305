"""Local kernels driven through jupyter_client: the demo's notebooks, and the tests'."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jupyter_client.manager import KernelManager


def _display_id(output: dict[str, Any]) -> str | None:
    return (output["content"].get("transient") or {}).get("display_id")


@dataclass
class Result:
    """What one execute request produced in one kernel."""

    status: str
    outputs: list[dict[str, Any]] = field(default_factory=list)
    user_expressions: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    payload: list[dict[str, Any]] = field(default_factory=list)
    finished: datetime | None = None  # when the kernel sent its reply, by the kernel's clock

    def shown(self) -> list[dict[str, Any]]:
        """The outputs as the notebook shows them at the end: each update_display_data replaces its display."""
        shown: list[dict[str, Any]] = []
        for out in self.outputs:
            if out["msg_type"] != "update_display_data":
                shown.append(out)
                continue
            wanted = _display_id(out)
            for i, old in enumerate(shown):
                if old["msg_type"] == "display_data" and _display_id(old) == wanted:
                    shown[i] = {"msg_type": "display_data", "content": out["content"]}
        return shown

    def updates(self, mime: str = "text/plain") -> list[str]:
        """Every version of the displays that were updated in place, in order (a live table's steps)."""
        ids = {_display_id(o) for o in self.outputs if o["msg_type"] == "update_display_data"}
        return [o["content"]["data"][mime] for o in self.outputs
                if o["msg_type"] in ("display_data", "update_display_data") and mime in o["content"]["data"]
                and _display_id(o) in ids - {None}]

    def text(self) -> str:
        """All text the cell shows at its end: streams, text/plain of results and displays, errors."""
        parts = []
        for out in self.shown():
            kind = out["msg_type"]
            content = out["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind in ("display_data", "execute_result"):
                parts.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                parts.append("\n".join(content["traceback"]) + "\n")
        return "".join(parts)

    def displays(self, mime: str = "text/html") -> list[str]:
        """The displays the cell shows at its end (updated in place where they were)."""
        return [
            o["content"]["data"][mime]
            for o in self.shown()
            if o["msg_type"] in ("display_data", "execute_result") and mime in o["content"]["data"]
        ]

    def expression(self, name: str) -> str:
        """The text/plain value of a user expression, or raise with the kernel's error."""
        value = self.user_expressions[name]
        if value.get("status") != "ok":
            raise RuntimeError(f"user expression {name!r} failed: {value.get('evalue')}")
        text: str = value["data"]["text/plain"]
        return text


def execute(client: Any, code: str, timeout: float = 120, user_expressions: dict[str, str] | None = None,
            stdin: Callable[[str], str | None] | None = None) -> Result:
    """Run ``code`` through a blocking kernel client and collect what it showed; ``stdin(prompt)`` answers each
    ``input()`` it asks for (None: the kernel may not ask). An answer of None sends no reply: the input waits on
    (for the stop button, say, which ends it)."""
    outputs: list[dict[str, Any]] = []

    def answer(msg: dict[str, Any]) -> None:
        assert stdin is not None
        typed = stdin(msg["content"]["prompt"])
        if typed is not None:
            client.input(typed)

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] in ("stream", "display_data", "execute_result", "error", "update_display_data"):
            outputs.append({"msg_type": msg["msg_type"], "content": msg["content"]})

    reply = client.execute_interactive(
        code, timeout=timeout, output_hook=hook, user_expressions=user_expressions or {}, allow_stdin=stdin is not None,
        stdin_hook=None if stdin is None else answer,
    )
    content = reply["content"]
    error = None
    if content["status"] == "error":
        error = {k: content.get(k) for k in ("ename", "evalue", "traceback")}
    return Result(content["status"], outputs, content.get("user_expressions", {}), error,
                  content.get("payload", []), reply["header"].get("date"))


class Kernel:
    """One IPython kernel with a blocking client."""

    def __init__(self, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        # Local kernels talk over Unix sockets in a private folder: nothing listens on TCP.
        self._dir = tempfile.mkdtemp(prefix="nbdist-kernel-")
        self.manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(self._dir, "k"))
        kernel_env = {**os.environ, **(env or {})}
        self.manager.start_kernel(env=kernel_env, cwd=cwd)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def execute(
        self, code: str, timeout: float = 120, user_expressions: dict[str, str] | None = None,
        stdin: Callable[[str], str | None] | None = None,
    ) -> Result:
        """Run ``code``; raise TimeoutError if the kernel is not idle within ``timeout`` s. ``stdin(prompt)``
        answers each ``input()`` the code asks for (None: no reply)."""
        return execute(self.client, code, timeout, user_expressions, stdin)

    def interrupt(self) -> None:
        self.manager.interrupt_kernel()

    def shutdown(self) -> None:
        """Stop the kernel (ask, then kill); idempotent."""
        try:
            self.client.stop_channels()
        finally:
            if self.manager.has_kernel:
                self.manager.shutdown_kernel(now=False)
            shutil.rmtree(self._dir, ignore_errors=True)


def start(n: int, env: dict[str, str] | None = None) -> list[Kernel]:
    """Start ``n`` kernels in parallel."""
    kernels: list[Kernel | None] = [None] * n
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            kernels[i] = Kernel(env)
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for k in kernels:
            if k is not None:
                k.shutdown()
        raise errors[0]
    return [k for k in kernels if k is not None]


def execute_all(
    kernels: Sequence[Kernel],
    codes: str | Sequence[str],
    timeout: float = 120,
    user_expressions: dict[str, str] | None = None,
    stdin: Sequence[Callable[[str], str | None] | None] | None = None,
) -> list[Result]:
    """Run a cell (or one cell per kernel) in every kernel at once; results in kernel order. ``stdin``: for each
    kernel, what answers its ``input()`` (see :meth:`Kernel.execute`)."""
    if isinstance(codes, str):
        codes = [codes] * len(kernels)
    answers = list(stdin) if stdin is not None else [None] * len(kernels)
    results: list[Result | BaseException | None] = [None] * len(kernels)

    def one(i: int) -> None:
        try:
            answer = {} if answers[i] is None else {"stdin": answers[i]}  # a kernel's stand-in may take no stdin
            results[i] = kernels[i].execute(codes[i], timeout, user_expressions, **answer)
        except BaseException as exc:  # re-raised in the caller's thread
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(kernels))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
