"""Running a cell body on this rank and capturing what it produced, as JSON-ready data.

Output is captured without replacing objects that user code keeps: while nbdist
is loaded, ``sys.stdout`` and ``sys.stderr`` are :class:`RoutedStream` objects
that write to the running cell's capture, and otherwise on to the streams they
stand in for. A logging handler made inside a cell (``logging.basicConfig()``)
therefore keeps working after it.
"""

from __future__ import annotations

import ast
import base64
import io
import sys
import time
import traceback
from collections import deque
from typing import Any

from IPython.core.displaypub import CapturingDisplayPublisher

from .config import MAX_FIELD_CHARS

# Rich outputs copied into the capture; the rest are shown by their text/plain.
# HTML, SVG and JavaScript are left out on purpose: another rank's output must
# never run code in this notebook.
_KEPT_MIMES = ("text/plain", "image/png", "image/jpeg")


class BoundedStream(io.TextIOBase):
    """A text stream that keeps the head and the tail of what is written, never blocking."""

    def __init__(self, limit: int = MAX_FIELD_CHARS) -> None:
        self._half = max(1, limit // 2)
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        n = len(text)
        self.total += n
        room = self._half - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, n)
            text = text[room:]
        if text:
            self._tail.append(text)
            self._tail_len += len(text)
            while self._tail_len - len(self._tail[0]) >= self._half:
                self._tail_len -= len(self._tail.popleft())
        return n

    def getvalue(self) -> str:
        head = "".join(self._head)
        tail = "".join(self._tail)
        kept = len(head) + len(tail)
        if kept <= 2 * self._half and kept == self.total:
            return head + tail
        tail = tail[-self._half :]
        dropped = self.total - len(head) - len(tail)
        return f"{head}\n… [{dropped:,} characters not shown: output truncated] …\n{tail}"


class RoutedStream:
    """Stands in for ``sys.stdout`` or ``sys.stderr``: writes go to :attr:`target` during a cell, else on."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.target: BoundedStream | None = None

    def write(self, text: Any) -> int:
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8", errors="replace")  # a notebook would refuse bytes; keep them
        target = self.target
        return (self.real if target is None else target).write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.target is None:
            self.real.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno... of the real stream
        return getattr(self.real, name)


def routed_streams() -> tuple[RoutedStream, RoutedStream]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`RoutedStream` (installed on first use, and again if replaced)."""
    streams = []
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if not isinstance(current, RoutedStream):
            current = RoutedStream(current)
            setattr(sys, name, current)
        streams.append(current)
    return streams[0], streams[1]


def unroute_streams() -> None:
    """Put the real streams back where a :class:`RoutedStream` stands (``%unload_ext``); kept ones pass through."""
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if isinstance(current, RoutedStream):
            current.target = None
            setattr(sys, name, current.real)


def truncate(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    stream = BoundedStream(limit)
    stream.write(text)
    return stream.getvalue()


def _split_last_expression(tree: ast.Module) -> tuple[ast.Module, ast.Expression | None]:
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return tree, last
    return tree, None


def _kept(data: dict[str, Any]) -> dict[str, str]:
    """The MIME types nbdist passes on, as JSON-ready text: images as base64, text truncated."""
    kept = {}
    for mime in _KEPT_MIMES:
        value = data.get(mime)
        if isinstance(value, bytes | bytearray):  # PIL and others give raw PNG/JPEG bytes
            value = base64.b64encode(bytes(value)).decode("ascii") if mime != "text/plain" else None
        if isinstance(value, str):
            kept[mime] = truncate(value) if mime == "text/plain" else value
    return kept


def _format_value(shell: Any, value: Any) -> dict[str, str]:
    data, _ = shell.display_formatter.format(value)
    return _kept(data)


def _flush_figures() -> None:
    """Draw the figures matplotlib's inline backend would show after the cell, into this capture."""
    module = sys.modules.get("matplotlib_inline.backend_inline")
    flush = getattr(module, "flush_figures", None)
    if flush is not None:
        flush()


def _format_error(exc: BaseException, skip: int) -> dict[str, str]:
    tb = exc.__traceback__
    for _ in range(skip):  # drop this module's own frames
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"ename": type(exc).__name__, "evalue": str(exc), "traceback": truncate(text)}


def run_cell(shell: Any, source: str) -> dict[str, Any]:
    """Run ``source`` in the user's namespace like IPython would; return what it produced.

    The result has ``stdout``, ``stderr``, ``result`` (mime bundle of the last
    expression), ``displays`` (mime bundles), ``error`` (or None) and ``wall``.
    """
    out, err = BoundedStream(), BoundedStream()
    publisher = CapturingDisplayPublisher()
    stdout, stderr = routed_streams()
    saved = shell.display_pub
    stdout.target, stderr.target, shell.display_pub = out, err, publisher
    result: dict[str, str] | None = None
    error = None
    start = time.perf_counter()
    try:
        transformed = shell.transform_cell(source)
        filename = shell.compile.cache(transformed, shell.execution_count, raw_code=source)
        tree, last = _split_last_expression(ast.parse(transformed, filename))
        exec(compile(tree, filename, "exec"), shell.user_ns)  # noqa: S102 (the user's own cell)
        if last is not None:
            value = eval(compile(last, filename, "eval"), shell.user_ns)  # noqa: S307
            if value is not None and not source.rstrip().endswith(";"):
                result = _format_value(shell, value)
    except BaseException as exc:  # every failure is the user's, shown in the table
        error = _format_error(exc, skip=1)
        error["interrupted"] = isinstance(exc, KeyboardInterrupt)
    finally:
        wall = time.perf_counter() - start
        try:
            _flush_figures()  # what the inline backend would draw after the cell belongs in this rank's column
        finally:
            stdout.target, stderr.target, shell.display_pub = None, None, saved
    displays = [data for output in publisher.outputs if (data := _kept(output["data"]))]
    return {
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "result": result,
        "displays": displays,
        "error": error,
        "wall": wall,
    }
