"""Running a cell body on this rank and capturing what it produced (its typed record: ``world.capture_record``).

Output is captured without replacing objects that user code keeps: while nbdist
is loaded, ``sys.stdout`` and ``sys.stderr`` are :class:`RoutedStream` objects
that write to the running cell's capture, and otherwise on to the streams they
stand in for. A logging handler made inside a cell (``logging.basicConfig()``)
therefore keeps working after it.
"""

from __future__ import annotations

import ast
import base64
import bdb
import contextlib
import functools
import io
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from IPython.core.displaypub import DisplayPublisher

from ..config import MAX_FIELD_CHARS
from ..errors import StopRequest
from ..view import tracebacks
from ..world.capture_record import Capture, Raised
from . import progress
from .outputlog import OutputLog, StreamWriter

# Rich outputs copied into the capture; the rest (JavaScript, widgets) are shown by their text/plain.
# The viewing notebook decides how each is shown: HTML only after sanitising, Markdown, LaTeX and SVG as
# their source text (see nbdist.view.display); another rank's output must never run code in this notebook.
_KEPT_MIMES = ("text/plain", "image/png", "image/jpeg", "text/html", "text/markdown", "text/latex", "image/svg+xml")


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
        self.target: StreamWriter | None = None

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
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        return tree, ast.Expression(last.value)
    return tree, None


def _kept(data: dict[str, Any]) -> dict[str, str]:
    """The MIME types nbdist passes on, as JSON-ready text: images as base64, text truncated."""
    kept = {}
    for mime in _KEPT_MIMES:
        value = data.get(mime)
        if isinstance(value, bytes | bytearray):  # PIL and others give raw PNG/JPEG bytes
            value = base64.b64encode(bytes(value)).decode("ascii") if mime != "text/plain" else None
        if isinstance(value, str):
            kept[mime] = value if mime.startswith("image/") and mime != "image/svg+xml" else truncate(value)
    return kept


def _format_value(shell: Any, value: Any) -> dict[str, str]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        from ..view.pictures import picture  # a tensor as the cell's value is drawn as nbdist.show draws it

        data = picture(value)._repr_mimebundle_()
        data["text/plain"] = repr(value)  # the Out row's text form stays torch's own
        return _kept(data)
    data, _ = shell.display_formatter.format(value)
    return _kept(data)


def _flush_figures() -> None:
    """Draw the figures matplotlib's inline backend would show after the cell, into this capture."""
    module = sys.modules.get("matplotlib_inline.backend_inline")
    flush = getattr(module, "flush_figures", None)
    if flush is not None:
        flush()


class LogPublisher(DisplayPublisher):
    """The display publisher during a cell: every display goes into the cell's :class:`OutputLog`, in order."""

    def __init__(self, log: OutputLog, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self.log = log

    def publish(self, data: dict[str, Any], metadata: Any = None, source: Any = None, *, transient: Any = None,
                update: bool = False, **kwargs: Any) -> None:
        display_id = (transient or {}).get("display_id")
        self.log.display(_kept(data), display_id, update)

    def clear_output(self, wait: bool = False) -> None:
        self.log.clear()


_PUBLISHERS: weakref.WeakKeyDictionary[Any, LogPublisher] = weakref.WeakKeyDictionary()


def _publisher(shell: Any, log: OutputLog) -> LogPublisher:
    """The shell's capture publisher, aimed at ``log``: made once (a traitlets object costs a trivial cell)."""
    publisher = _PUBLISHERS.get(shell)
    if publisher is None:
        publisher = _PUBLISHERS[shell] = LogPublisher(log, shell=shell)
    publisher.log = log
    return publisher


@functools.lru_cache(maxsize=64)
def _transformed(transform: Any, source: str) -> str:
    """IPython's transformation of a cell's source (magics, ``!``, help), cached: the same cell runs again and again."""
    return str(transform(source))


Keep = Callable[[BaseException | None, TracebackType | None], None]  # told how a body ended (%dist_pdb keeps it)
Around = Callable[[], AbstractContextManager[Any]]  # a context the body's code runs in; what it prints is the body's


def run_cell(shell: Any, source: str, log: OutputLog | None = None, keep: Keep | None = None,
             around: Around | None = None) -> Capture:
    """Run ``source`` in the user's namespace like IPython would; return what it produced.

    The capture has ``outputs`` (stream text and displays in the order they came,
    see :mod:`nbdist.cell.outputlog`), ``result`` (mime bundle of the last
    expression), ``error`` (or None) and ``wall``. ``log`` lets a watcher
    read the outputs while the body runs. ``keep`` is told the body's exception and its traceback from the
    cell's own frames (None, None: it raised nothing). ``around`` makes a context the code runs in (its last
    expression too); what it prints as it ends is the body's output, before the result.
    """
    log = OutputLog() if log is None else log
    stdout, stderr = routed_streams()
    saved = shell.display_pub
    stdout.target, stderr.target = StreamWriter(log, "stdout"), StreamWriter(log, "stderr")
    shell.display_pub = _publisher(shell, log)
    result: dict[str, str] | None = None
    start = time.perf_counter()
    wall = 0.0
    try:
        error, result, wall = _run_body(shell, source, log, stdout, stderr, saved, start, keep, around)
    except BaseException as late:  # noqa: BLE001
        # A stop (--max-time, a stop of every rank) signalled while the body was ending lands here, in
        # nbdist's own bookkeeping: it is the body's error, so this rank still reaches the cell's end.
        stdout.target, stderr.target, shell.display_pub = None, None, saved
        wall = wall or time.perf_counter() - start
        error = error_of(late, skip=0)
    return Capture(outputs=[_drop_empty(o) for o in log.snapshot()], result=result, error=error, wall=wall)


def _run_body(shell: Any, source: str, log: OutputLog, stdout: Any, stderr: Any, saved: Any,
              start: float, keep: Keep | None,
              around: Around | None = None) -> tuple[Raised | None, dict[str, str] | None, float]:
    result: dict[str, str] | None = None
    error = None
    failed: BaseException | None = None
    try:
        # A blank first line stands for the %%collective line, so line numbers are the notebook cell's own.
        transformed = "\n" + _transformed(shell.transform_cell, source)
        filename = shell.compile.cache(transformed, shell.execution_count, raw_code="\n" + source)
        tree, last = _split_last_expression(ast.parse(transformed, filename))
        with progress.TextBars(), (contextlib.nullcontext() if around is None else around()):
            exec(compile(tree, filename, "exec"), shell.user_ns)  # noqa: S102 (the user's own cell)
            value = None if last is None else eval(compile(last, filename, "eval"), shell.user_ns)  # noqa: S307
        if value is not None and not source.rstrip().endswith(";"):
            result = _format_value(shell, value)
    except BaseException as exc:  # every failure is the user's, shown in the table
        error = error_of(exc, skip=1)
        failed = exc
    finally:
        wall = time.perf_counter() - start
        try:
            _flush_figures()  # what the inline backend would draw after the cell belongs in this rank's column
        finally:
            stdout.target, stderr.target, shell.display_pub = None, None, saved
    if keep is not None:  # the traceback without this frame: the debugger opens in the cell's own code
        tb = failed.__traceback__ if failed is not None else None
        keep(failed, tb.tb_next if tb is not None and tb.tb_next is not None else tb)
    return error, result, wall


def error_of(exc: BaseException, skip: int = 0) -> Raised:
    """A body's error as its capture records it: as its column shows it (the user's frames, ``short``; the full
    ``traceback``; ``where``), and whether the stop button ended it."""
    summary = tracebacks.summarise(exc, skip)  # skip: this module's own frames
    return Raised(ename=summary["ename"], evalue=summary["evalue"], traceback=truncate(summary["traceback"]),
                  short=truncate(summary["short"]), where=summary["where"], interrupted=_stopped(exc))


def _stopped(exc: BaseException) -> bool:
    """Whether a body ended as the stop button ends it: the button, or ``q`` in its debugger (``BdbQuit``)."""
    return (isinstance(exc, KeyboardInterrupt) and not isinstance(exc, StopRequest)) or isinstance(exc, bdb.BdbQuit)


def _drop_empty(output: dict[str, Any]) -> dict[str, Any]:
    """A display whose every kept form was dropped still says it was there."""
    if output["kind"] == "display" and not output["data"]:
        return {"kind": "display", "data": {"text/plain": "[a display with no form nbdist can show]"}}
    return output
