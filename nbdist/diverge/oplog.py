"""One rank's operation log: every operation a ``%%collective --find-divergence`` body ran, with its output's hash.

The body runs under torch's ``DebugMode`` (``torch.utils._debug_mode``, torch 2.10 and later; a private module,
pinned by ``tests/diverge/test_oplog_torch.py``), which sees every dispatched operation: the forward's,
autograd's in the backward, the optimizer's, and the collectives of ``torch.distributed`` (``c10d.allreduce_``
and the others reach the dispatcher on every backend; the functional collectives too). A log hook installed
with ``DebugMode.dispatch_hooks`` keeps, for each, one compact :class:`Op`: its name, its outputs' shapes, a
64-bit hash of its output (bit for bit; an in-place operation that returns nothing: of what it wrote), the cell
line it ran on, and for autograd's operations the node and the forward line that made it (autograd's anomaly
mode keeps that line). DebugMode's own records are not kept, so memory grows by one small :class:`Op` an
operation, and recording stops at :data:`MAX_OPS` (the log says so; the body runs on unrecorded).

A collective's output is written by the backend after the call returns (gloo's worker thread, a device stream),
so its hash is taken when its work is complete: before the next operation runs, or at the body's end.
Operations whose output is uninitialised memory (``empty``, ``empty_like``...) are logged by name only.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CollectiveMismatchError
from ..view import tracebacks
from . import firstdiff

MAX_OPS = 100_000  # operations recorded per body (about 20 MB of log); later ones run unrecorded
_SEED = b"nbdist oplog"
_END = b"end of the log"
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded operation: ``name`` (``aten.addmm.default``), ``shapes`` (``f32[8, 4]``), ``digest`` (its
    output's hash; None: not compared), ``line`` (the cell line it ran on), ``node`` (autograd's node running it,
    in the backward) and ``origin`` (the forward line that made that node)."""

    name: str
    shapes: str
    digest: int | None
    line: int | None
    node: str | None = None
    origin: int | None = None


def _chained(previous: bytes, *parts: bytes) -> bytes:
    h = hashlib.blake2b(previous, digest_size=8)
    for part in parts:
        h.update(part)
    return h.digest()


def as_int(digest: bytes) -> int:
    """An 8-byte digest as the signed 64-bit integer an ``int64`` tensor carries."""
    return int.from_bytes(digest, "little", signed=True)


class OpLog:
    """The operations one rank ran, in order, with a running digest of the sequence after each (of names and
    hashes, and of names alone), so that ranks compare any prefix by exchanging 8 bytes."""

    def __init__(self, limit: int = MAX_OPS) -> None:
        self.limit = limit
        self.ops: list[Op] = []
        self.unrecorded = 0  # operations run after the limit
        self._full = array.array("q", [as_int(_chained(_SEED))])
        self._names = array.array("q", [as_int(_chained(_SEED))])
        self._pending: list[tuple[int, Any, Any]] = []  # (index, outputs, work) of collectives still running

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def full(self) -> bool:
        return self.unrecorded > 0

    def add(self, op: Op) -> int | None:
        """Log ``op`` (its digest may come later: :meth:`settle`); its index, or None past the limit."""
        if len(self.ops) >= self.limit:
            self.unrecorded += 1
            return None
        self.ops.append(op)
        self._extend(op)
        return len(self.ops) - 1

    def _extend(self, op: Op) -> None:
        name = op.name.encode()
        digest = b"-" if op.digest is None else op.digest.to_bytes(8, "little", signed=True)
        previous = self._full[-1].to_bytes(8, "little", signed=True)
        self._full.append(as_int(_chained(previous, name, b"\0", digest)))
        self._names.append(as_int(_chained(self._names[-1].to_bytes(8, "little", signed=True), name, b"\0")))

    def settle(self, index: int, digest: int | None) -> None:
        """Give the op at ``index`` its digest (a collective's, once complete): the running digests are redone
        from there (a collective is settled before the next operation is logged, so this is the last few)."""
        self.ops[index] = Op(**{**_fields(self.ops[index]), "digest": digest})
        del self._full[index + 1:], self._names[index + 1:]
        for op in self.ops[index:]:
            self._extend(op)

    def prefix(self, n: int, names_only: bool = False) -> int:
        """The digest of the first ``n`` operations (names and hashes, or names alone); past the log's end, the
        whole log's followed by an end mark, the same for every ``n`` past it."""
        digests = self._names if names_only else self._full
        if n <= len(self.ops):
            return int(digests[n])
        return as_int(_chained(digests[-1].to_bytes(8, "little", signed=True), _END))


def _fields(op: Op) -> dict[str, Any]:
    return {name: getattr(op, name) for name in Op.__slots__}


# -- recording under DebugMode ---------------------------------------------------------------------------------

_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32",
           "int8": "i8", "uint8": "u8", "bool": "b8", "complex64": "c64", "complex128": "c128"}


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _shape(t: Any) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{_DTYPES.get(dtype, dtype)}{list(t.shape)}"


def tensor_digest(t: Any) -> int | None:
    """A tensor's 64-bit hash, bit for bit and position by position (blake2b of its bytes, with dtype and shape);
    None for a tensor whose bytes cannot be read (sparse, meta, a tensor subclass)."""
    import torch

    try:
        with torch._C._DisablePythonDispatcher():
            data = t.detach()
            if data.device.type != "cpu":
                data = data.cpu()  # a device's tensor is copied to hash it: the cost of the flag on a device
            raw = data.contiguous().reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    h = hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=8)
    h.update(memoryview(raw))
    return as_int(h.digest())


def _combined(tensors: list[Any]) -> int | None:
    digests = [tensor_digest(t) for t in tensors]
    if not digests or any(d is None for d in digests):
        return None
    if len(digests) == 1:
        return digests[0]
    return as_int(_chained(b"".join(d.to_bytes(8, "little", signed=True) for d in digests if d is not None)))


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The tensors an operation writes in place (its schema's mutable arguments): what a ``_foreach_add_``,
    which returns nothing, changed."""
    schema = getattr(func, "_schema", None)
    written: list[Any] = []
    for i, arg in enumerate(getattr(schema, "arguments", ())):
        alias = arg.alias_info
        if alias is not None and alias.is_write:
            written += _tensors(args[i] if i < len(args) else kwargs.get(arg.name))
    return written


def _work(result: Any) -> Any:
    """The ``Work`` of a ``c10d`` operation's result (the dispatcher hands it over boxed), or None."""
    import torch

    for item in result if isinstance(result, tuple) else (result,):
        if isinstance(item, torch.ScriptObject):
            return torch._C._distributed_c10d.Work.unbox(item)
    return None


_BODY_RUNNER = "nbdist.cell.capture"  # the module whose frame runs a body: the cell frames above it are not the body's
_BODY_RUNNER_FILE = os.path.join("nbdist", "cell", "capture.py")


def _cell_line() -> int | None:
    """The line of the running cell's code that called the operation: the innermost frame compiled from the body
    being run (the outermost cell frame below nbdist's body runner), so that a helper made in an earlier cell is
    named by the body's line that called it, not by a line of that other cell."""
    frame = sys._getframe(2)
    found: list[tuple[str, int]] = []
    while frame is not None and frame.f_globals.get("__name__") != _BODY_RUNNER:
        if tracebacks.is_cell(frame.f_code.co_filename):
            found.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back  # type: ignore[assignment]
    return _innermost_of_running(found)


def _innermost_of_running(found: Sequence[tuple[str, int]]) -> int | None:
    """Of cell frames ``(file, line)``, innermost first, the line of the innermost in the outermost's file."""
    if not found:
        return None
    running = found[-1][0]
    return next(line for file, line in found if file == running)


def _origin(node: Any) -> int | None:
    """The cell line whose forward made autograd's ``node`` (anomaly mode keeps its traceback, outermost first;
    the frames from nbdist's body runner on are the body's)."""
    try:
        trace = node.metadata.get("traceback_")
    except (AttributeError, RuntimeError):
        return None
    frames = [(m.group(1), int(m.group(2))) for entry in trace or () if (m := _FRAME.search(entry)) is not None]
    runner = max((k for k, (file, _) in enumerate(frames) if file.endswith(_BODY_RUNNER_FILE)), default=-1)
    found = [(file, line) for file, line in frames[runner + 1:] if tracebacks.is_cell(file)]
    return _innermost_of_running(found[::-1])


class Recording:
    """The hooks of one body's recording: each operation DebugMode dispatches becomes an :class:`Op` of ``log``."""

    def __init__(self, log: OpLog) -> None:
        self.log = log

    def before(self, func: Any, types: Any, args: Any, kwargs: Any, call: Any) -> None:
        """DebugMode's pre-hook: a collective that completed meanwhile gets its hash before anything else writes."""
        if self.log._pending:
            self.settle()

    def settle(self, final: bool = False) -> None:
        """Hash the outputs of the collectives whose work is complete (``final``: the body ended; one still running
        is logged without a hash)."""
        still = []
        for index, outputs, work in self.log._pending:
            done = work is None or work.is_completed()
            if done or final:
                self.log.settle(index, _combined(outputs) if done else None)
            else:
                still.append((index, outputs, work))
        self.log._pending = still

    def after(self, func: Any, types: Any, args: Any, kwargs: Any, result: Any) -> None:
        """DebugMode's log hook: log the operation that just ran."""
        import torch

        log = self.log
        if len(log.ops) >= log.limit:
            log.unrecorded += 1
            return None
        name = str(func)  # aten.addmm.default, as DebugMode writes it
        if name.startswith("profiler."):
            return None
        outputs = _tensors(result)
        written = outputs or _written(func, args, kwargs)
        shapes = ", ".join(_shape(t) for t in written[:4]) + (", …" if len(written) > 4 else "")
        node = torch._C._current_autograd_node()
        work = _work(result) if name.startswith("c10d.") else None
        # Uninitialised memory is not compared; nor a functional collective's output, still being written (the
        # operations that read it, after its wait, are).
        unsettled = "empty" in name or name.startswith("_c10d_functional.") and "wait" not in name
        digest = None if unsettled or work is not None else _combined(written)
        backward = None if node is None else node.name().rsplit("::", 1)[-1]  # AccumulateGrad, not torch::autograd::
        index = log.add(Op(name, shapes, digest, _cell_line(), backward, None if node is None else _origin(node)))
        if work is not None and index is not None:
            log._pending.append((index, written, work))
        return None


@contextlib.contextmanager
def recorded(log: OpLog) -> Iterator[OpLog]:
    """Run the ``with`` block under DebugMode, logging every operation into ``log``."""
    import torch
    from torch.utils._debug_mode import DebugMode

    class _Quiet(DebugMode):  # type: ignore[no-untyped-call]
        """DebugMode keeping none of its own records: the log hook keeps the compact ones."""

        def _record_call(self, call: Any) -> None:
            return None

    recording = Recording(log)
    mode = _Quiet(record_output=False, record_profiler_context=False)
    # Autograd's anomaly mode keeps the forward's traceback on each node: the forward line of a backward op.
    anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False)
    with anomaly, DebugMode.dispatch_hooks(log_hook=recording.after, pre_log_hook=recording.before), mode:
        try:
            yield log
        finally:
            recording.settle(final=True)


# -- the flag: record the body, then compare with every rank -------------------------------------------------

_TEXT_BYTES = 4096  # the last round's record, JSON; firstdiff keeps it well below


def _device(dist: Any) -> Any:
    """Where the group's collectives take their tensors: the CPU for gloo, else this process's accelerator."""
    import torch

    if dist.get_backend() == "gloo":
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def _exchange(log: OpLog) -> tuple[firstdiff.Ask, firstdiff.AskText, int]:
    """The comparison's rounds over the default process group: each rank's answer to a question put to its own
    log, gathered with ``all_gather`` (int64 tensors, and the last round's JSON as bytes); and the world's size."""
    import torch
    import torch.distributed as dist

    size, device = dist.get_world_size(), _device(dist)

    def ask(question: Callable[[OpLog], list[int]]) -> list[list[int]]:
        mine = torch.tensor(question(log), dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(every, mine)
        return [t.tolist() for t in every]

    def ask_text(question: Callable[[OpLog], str]) -> list[str]:
        raw = question(log).encode()[:_TEXT_BYTES]
        mine = torch.zeros(_TEXT_BYTES + 8, dtype=torch.uint8)
        mine[:8] = torch.tensor(list(len(raw).to_bytes(8, "little")), dtype=torch.uint8)
        mine[8:8 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else mine[8:8]
        every = [torch.empty_like(mine, device=device) for _ in range(size)]
        dist.all_gather(every, mine.to(device))
        texts = []
        for t in every:
            data = bytes(t.cpu().tolist())
            texts.append(data[8:8 + int.from_bytes(data[:8], "little")].decode(errors="replace"))
        return texts

    return ask, ask_text, size


@contextlib.contextmanager
def find_divergence(replicas: Sequence[int] | None = None, limit: int = MAX_OPS) -> Iterator[OpLog]:
    """``%%collective --find-divergence``'s part on one rank, around the body: record every operation it runs;
    if it ends without raising, compare the logs with every other rank (a collective over the default group,
    which every rank enters after its body) and print the answer, the same on every rank."""
    log = OpLog(limit)
    with recorded(log):
        yield log
    ask, ask_text, size = _exchange(log)
    try:
        found = firstdiff.compare(ask, ask_text, size, replicas)
    except CollectiveMismatchError as exc:  # the comparison's first gather met a collective of another rank's body
        raise CollectiveMismatchError(
            f"--find-divergence: this rank ended its body after {len(log):,} operation(s) and began the comparison "
            f"(its first collective is an all_gather), while another rank was still in a collective of the body "
            f"that this rank never called. {exc}") from None
    print(firstdiff.describe(found))
